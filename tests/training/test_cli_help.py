"""`mulo-decode --help` and `mulo-eval --help` answer in well under a second, before torch, Lightning or
Hydra load, with every setting, its YAML default and its comment (training/commands.py,
training/knob_help.py); anything else runs the Hydra entry point."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mulo_sd.training import commands
from mulo_sd.training.config import CONFIG_DIR
from mulo_sd.training.knob_help import model_set, read_config

SCRIPTS = Path(sys.executable).parent  # the environment's console scripts
HEAVY = ("torch", "lightning", "hydra", "omegaconf")


def help_of(command: str, flag: str = "--help") -> str:
    started = time.perf_counter()
    done = subprocess.run([str(SCRIPTS / command), flag], capture_output=True, text=True, timeout=60)
    elapsed = time.perf_counter() - started
    assert done.returncode == 0, done.stderr
    assert elapsed < 5, f"{command} {flag} took {elapsed:.1f} s"
    return done.stdout


def setting_line(text: str, name: str) -> str:
    (line,) = [line for line in text.splitlines() if line.startswith(f"  {name}=")]
    return line


def test_decode_help_lists_every_knob_with_its_default_and_description():
    text = help_of("mulo-decode")
    tau = setting_line(text, "knobs.tau")
    assert re.fullmatch(r"  knobs\.tau=default\s+mulo \(0\.02\): accept threshold", tau)
    assert re.search(r"^  method=ar\s+ar \| zipar \| lantern \| eagle2 \| mulo$", text, re.MULTILINE)
    decode = yaml.safe_load((CONFIG_DIR / "decode" / "default.yaml").read_text())
    for knob, default in decode["knobs"].items():  # the defaults are the YAML's, not a copy
        assert setting_line(text, f"knobs.{knob}").split()[0] == f"knobs.{knob}={default}"
    assert setting_line(text, "sampler.cfg_scale").split()[0] == "sampler.cfg_scale=2.0"  # the testbed set's
    assert "models=NAME (default testbed):" in text
    assert re.search(r"^  tar_1024 +Tar text-to-image", text, re.MULTILINE)
    assert help_of("mulo-decode", "-h") == text


def test_eval_help_lists_the_presets_and_settings():
    text = help_of("mulo-eval")
    assert re.search(r"^  smoke +A few seconds on the testbed", text, re.MULTILINE)
    assert re.match(r"  fd_min_images=48 +Tables show fd", setting_line(text, "fd_min_images"))
    assert setting_line(text, "prompts.count").split()[0] == "prompts.count=8"
    assert "logger=NAME (default none):" in text


@pytest.mark.parametrize("entry", ["decode", "decode/default", "evaluate", "paths/default"])
def test_every_setting_has_a_description(entry):
    knobs = read_config(CONFIG_DIR / f"{entry}.yaml").knobs
    undescribed = [knob.name for knob in knobs if not knob.section and not knob.about]
    assert knobs and undescribed == []


def test_model_sets_merge_their_defaults_as_hydra_does():
    assert model_set("testbed")["sampler"]["cfg_scale"] == 2.0 and model_set("testbed")["name"] == "testbed"
    assert model_set("tar_512")["name"] == "tar_512" and "mllm" in model_set("tar_512")["folders"]


def test_help_imports_nothing_heavy_and_other_arguments_run_the_entry_point(monkeypatch):
    probe = "import sys; sys.argv = ['mulo-eval', '--help']; from mulo_sd.training import commands; "
    probe += f"commands.evaluate(); print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY}))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines()[-1] == "[]"
    from mulo_sd.training import decode

    ran = []
    monkeypatch.setattr(decode, "main", lambda: ran.append(sys.argv[1:]))
    monkeypatch.setattr(sys, "argv", ["mulo-decode", "method=ar", "--hydra-help"])
    commands.decode()
    assert ran == [["method=ar", "--hydra-help"]]
