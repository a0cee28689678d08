"""Model-set files read without Hydra (mulo_sd/pipeline/set_files.py) give the config Hydra composes for the
entry points, for every packaged set."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from mulo_sd.pipeline.roles import TESTBED_DIR
from mulo_sd.pipeline.set_files import packaged_sets, read_set_file, set_config
from tests.training.test_decode_cli import compose

ROOT = "/ckpts"


def hydra_models(tmp_path, *overrides: str) -> dict:
    return OmegaConf.to_container(compose("decode", tmp_path, list(overrides)).models, resolve=True)


@pytest.mark.parametrize("name", sorted(packaged_sets()))
def test_every_packaged_set_reads_as_hydra_composes_it(name, tmp_path):
    read = set_config(name)
    overrides = [f"models={name}"]
    if read["root"] == "???":
        read["root"] = ROOT
        overrides.append(f"models.root={ROOT}")
    assert read == hydra_models(tmp_path, *overrides)


def test_the_packaged_sets_and_a_folder_in_the_testbed_layout(tmp_path):
    assert {"testbed", "folder", "llamagen_t2i_xl_512", "tar_512", "tar_1024"} <= set(packaged_sets())
    assert set_config("testbed")["root"] == str(TESTBED_DIR)
    assert set_config(tmp_path) == hydra_models(tmp_path, "models=folder", f"models.root={tmp_path}")


def test_a_set_file_of_ones_own_builds_on_a_packaged_set(tmp_path):
    path = tmp_path / "my_tar.yaml"
    path.write_text("defaults:\n  - tar_512\n  - _self_\nname: my_tar\nroot: /mine\nfolders:\n  target: t\n")
    config = read_set_file(path)
    tar_512 = set_config("tar_512")
    folders = {**tar_512["folders"], "target": "t"}
    assert config == {**tar_512, "name": "my_tar", "root": "/mine", "folders": folders}


def test_what_a_set_file_cannot_hold_is_named(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\nroot: ${oc.env:HOME}\n")
    with pytest.raises(ValueError, match=r"root: '\$\{oc.env:HOME\}': a set file interpolates only"):
        read_set_file(path)
    path.write_text("defaults:\n  - no_such_set\nname: bad\n")
    with pytest.raises(FileNotFoundError, match=r"entry 'no_such_set': no .*no_such_set.yaml and no pack"):
        read_set_file(path)
    with pytest.raises(FileNotFoundError, match=r"no model set 'tar_2048': give a set's name \(\[.*'tar_1"):
        set_config("tar_2048")
