"""The wheel as a user installs it: built from the source tree, installed (not editable) into a fresh virtual
environment, and the three console scripts run from a folder outside the repository. Slow.

The fresh environment sees the test environment's installed dependencies through a folder of links (everything
but mulo_sd itself and pip), so pip finds torch & co. already satisfied instead of installing a second copy of
several GB, which filled the CI machine's disk; a dependency the test environment lacks is still installed."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO / ".ci" / "constraints.txt"

pytestmark = pytest.mark.slow


def _run(command: list[str], cwd: Path, env: dict) -> str:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done.stdout + done.stderr


def _link_dependencies(venv: Path, links: Path) -> None:
    """Expose this environment's packages, less mulo_sd and pip, to `venv` through a folder of links.

    A path listed in a .pth file is appended to sys.path without its own .pth files being run, so the editable
    mulo_sd install of this environment (a .pth hook) stays invisible: the venv can only import the wheel.
    """
    links.mkdir()
    skipped = ("mulo_sd", "__editable__", "pip", "_distutils_hack", "distutils-precedence")
    for site in {Path(sysconfig.get_paths()[key]) for key in ("purelib", "platlib")}:
        for entry in site.iterdir():
            if not entry.name.startswith(skipped) and not (links / entry.name).exists():
                (links / entry.name).symlink_to(entry)
    (venv_site,) = venv.glob("lib/python*/site-packages")
    (venv_site / "test_environment_dependencies.pth").write_text(f"{links}\n")


def _shard_times(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in sorted(folder.rglob("*.tar"))}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(bin folder, environment) of a fresh venv holding only the built wheel and its dependencies."""
    root = tmp_path_factory.mktemp("wheel")
    dist = root / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(REPO)],
        root,
        os.environ,
    )
    (wheel,) = dist.glob("mulo_sd-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        top_level = next(n for n in archive.namelist() if n.endswith(".dist-info/top_level.txt"))
        assert archive.read(top_level).decode().split() == ["mulo_sd"]  # no generic `data` / `training`
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], root, os.environ)
    _link_dependencies(venv, root / "dependencies")
    bin_dir = venv / "bin"
    _run([str(bin_dir / "pip"), "install", "-q", "-c", str(CONSTRAINTS), str(wheel)], root, os.environ)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env |= {
        "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}",
        "MULO_SD_CACHE": str(root / "cache"),
        "WANDB_MODE": "offline",
    }
    return bin_dir, env, root


def test_console_scripts_run_from_any_folder(installed):
    bin_dir, env, root = installed
    work = root / "elsewhere"
    work.mkdir()
    probe = "import mulo_sd.training, mulo_sd.conf; print(mulo_sd.__file__)"
    where = _run([str(bin_dir / "python"), "-c", probe], work, env)
    assert str(root / "venv") in where and str(REPO) not in where
    for method in ("ar", "mulo"):
        _run([str(bin_dir / "mulo-decode"), f"method={method}", "prompt=a red circle on a striped background",
              f"out={method}.png"], work, env)  # fmt: skip
        assert Image.open(work / f"{method}.png").size == (128, 128)

    train = [
        str(bin_dir / "mulo-train"), "experiment=testbed/upsampler_r2", "trainer.max_steps=2",
        "trainer.val_check_interval=2", "data.generate.train.count=24", "data.generate.val.count=8",
        "data.generate.train.seed=11", "data.generate.val.seed=12", "data.val_samples=8", "data.batch_size=4",
        "data.train_samples_per_epoch=24", "data.num_workers=0", "model.images.count=2", "export=exported",
    ]  # fmt: skip
    _run(train, work, env)
    assert (work / "exported" / "config.json").is_file()
    assert any((work / "runs" / "testbed_upsampler_r2").rglob("last.ckpt"))
    data = root / "cache" / "data"
    shards = _shard_times(data)
    assert shards, f"no generated shards under {data}"
    second = root / "another_folder"
    second.mkdir()
    _run(train, second, env)  # reuses the data rendered by the first run instead of rendering it again
    assert _shard_times(data) == shards

    output = _run([str(bin_dir / "mulo-eval"), "eval=smoke", "progress=false"], work, env)
    summary = next((work / "runs" / "eval_smoke").rglob("summary.csv"))
    assert "MuLo-SD (2x)" in summary.read_text() and "| AR |" in output
