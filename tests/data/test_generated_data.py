import concurrent.futures
import multiprocessing
import os
import time

import pytest
from mulo_sd.data import cli
from mulo_sd.data.cli import ensure_synthscenes, main

SCENES = dict(count=20, seed=3, size=32, shard_size=8)


def shard_bytes(folder):
    return {
        name: (folder / name).read_bytes() for name in sorted(os.listdir(folder)) if name.endswith(".tar")
    }


@pytest.fixture
def reference(tmp_path):
    """The shards of one plain `mulo-data synthscenes` run with the same arguments."""
    out = tmp_path / "reference"
    args = ["--out", str(out), "--count", "20", "--seed", "3", "--size", "32", "--shard-size", "8"]
    assert main(["synthscenes", *args]) == 0
    return shard_bytes(out)


@pytest.mark.parametrize(
    "executor", ["threads", pytest.param("processes", marks=pytest.mark.slow)], ids=["threads", "processes"]
)
def test_concurrent_runs_share_one_generation(tmp_path, reference, monkeypatch, executor):
    out = tmp_path / "cache" / "synthscenes_32" / "train"
    renders = tmp_path / "renders.txt"
    render = cli.write_synthscenes

    def slow_render(args):  # logs each generation; slow enough that both runs ask while it renders
        with open(renders, "a") as log:
            log.write(f"{args.out}\n")
        time.sleep(0.5)
        return render(args)

    monkeypatch.setattr(cli, "write_synthscenes", slow_render)  # forked processes inherit the patch
    if executor == "threads":
        pool = concurrent.futures.ThreadPoolExecutor(2)
    else:
        pool = concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork"))
    with pool:
        runs = [pool.submit(ensure_synthscenes, str(out), **SCENES) for _ in range(2)]
        specs = [run.result() for run in runs]
    assert specs == [f"{out}/synthscenes-{{000000..000002}}.tar"] * 2
    assert len(renders.read_text().splitlines()) == 1, "the second run must reuse the first one's scenes"
    assert shard_bytes(out) == reference
    assert sorted(os.listdir(out.parent)) == [".train.lock", "train"]  # no temporary folder left


def test_an_interrupted_generation_is_never_taken_as_complete(tmp_path, reference, monkeypatch):
    out = tmp_path / "train"
    render = cli.write_synthscenes

    def killed(args):  # writes real shards, then dies before the end
        render(args)
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "write_synthscenes", killed)
    with pytest.raises(KeyboardInterrupt):
        ensure_synthscenes(str(out), **SCENES)
    assert not out.exists() and sorted(os.listdir(tmp_path)) == [".train.lock", "reference"]

    monkeypatch.setattr(cli, "write_synthscenes", render)
    stale = tmp_path / ".train.partial-killed"  # what a run killed with SIGKILL leaves behind
    stale.mkdir()
    (stale / "synthscenes-000000.tar").write_bytes(b"half a shard")
    ensure_synthscenes(str(out), **SCENES)
    assert shard_bytes(out) == reference and not stale.exists()


def test_a_folder_without_manifest_is_refused(tmp_path):
    out = tmp_path / "train"
    out.mkdir()
    (out / "synthscenes-000000.tar").write_bytes(b"from an older, interrupted version")
    with pytest.raises(ValueError, match="train exists without synthscenes.json"):
        ensure_synthscenes(str(out), **SCENES)
