import concurrent.futures
import itertools
import json
import multiprocessing
import os
import time

import pytest
import webdataset as wds
from hydra import compose, initialize_config_dir
from mulo_sd.data import pretokenize as pretokenize_module
from mulo_sd.data import synthscenes_cache
from mulo_sd.data.cli import main
from mulo_sd.data.pretokenize import ensure_pretokenized
from mulo_sd.data.synthscenes_cache import ensure_synthscenes
from mulo_sd.training.config import CONFIG_DIR
from mulo_sd.training.datamodule import samples_read
from mulo_sd.training.train import prepare_data

from tests.helpers import tiny_vq

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
    render = synthscenes_cache.render_synthscenes

    def slow_render(args):  # logs each generation; slow enough that both runs ask while it renders
        with open(renders, "a") as log:
            log.write(f"{args.out}\n")
        time.sleep(0.5)
        return render(args)

    # forked processes inherit the patch
    monkeypatch.setattr(synthscenes_cache, "render_synthscenes", slow_render)
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
    render = synthscenes_cache.render_synthscenes

    def killed(args):  # writes real shards, then dies before the end
        render(args)
        raise KeyboardInterrupt

    monkeypatch.setattr(synthscenes_cache, "render_synthscenes", killed)
    with pytest.raises(KeyboardInterrupt):
        ensure_synthscenes(str(out), **SCENES)
    assert not out.exists() and sorted(os.listdir(tmp_path)) == [".train.lock", "reference"]

    monkeypatch.setattr(synthscenes_cache, "render_synthscenes", render)
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


def samples(folder, count):
    """The first `count` samples of the shards in `folder`, in shard order (less the shard they came from)."""
    tars = [str(folder / name) for name in shard_bytes(folder)]
    pipeline = wds.DataPipeline(wds.SimpleShardList(tars), wds.tarfile_to_samples())
    return [{k: v for k, v in s.items() if k != "__url__"} for s in itertools.islice(pipeline, count)]


def test_a_cache_grown_in_steps_holds_the_scenes_of_one_render(tmp_path, reference, monkeypatch):
    out = tmp_path / "train"
    renders = []
    render = synthscenes_cache.render_synthscenes

    def logged(args):
        renders.append((args.start_index, args.count))
        return render(args)

    monkeypatch.setattr(synthscenes_cache, "render_synthscenes", logged)
    assert ensure_synthscenes(str(out), **SCENES, needed=5) == f"{out}/synthscenes-{{000000..000000}}.tar"
    small = samples(out, 8)
    assert ensure_synthscenes(str(out), **SCENES, needed=12) == f"{out}/synthscenes-{{000000..000001}}.tar"
    assert ensure_synthscenes(str(out), **SCENES) == f"{out}/synthscenes-{{000000..000002}}.tar"
    assert renders == [(0, 8), (8, 8), (16, 4)], "each run renders only the shards the cache lacks"
    assert shard_bytes(out) == reference  # byte for byte the shards of one render of all 20
    assert samples(out, 8) == small == samples(tmp_path / "reference", 8)
    assert (out / "sizes.json").read_text() == (tmp_path / "reference" / "sizes.json").read_text()
    # a smaller run afterwards reads its own first shard only, so its data does not depend on the cache
    assert ensure_synthscenes(str(out), **SCENES, needed=3) == f"{out}/synthscenes-{{000000..000000}}.tar"
    assert len(renders) == 3


def test_an_interrupted_extension_is_never_taken_as_complete(tmp_path, reference, monkeypatch):
    out = tmp_path / "train"
    ensure_synthscenes(str(out), **SCENES, needed=8)
    render = synthscenes_cache.render_synthscenes

    def killed(args):  # writes real shards, then dies before the end
        render(args)
        raise KeyboardInterrupt

    monkeypatch.setattr(synthscenes_cache, "render_synthscenes", killed)
    with pytest.raises(KeyboardInterrupt):
        ensure_synthscenes(str(out), **SCENES)
    # the new shards are not claimed
    assert json.loads((out / "synthscenes.json").read_text())["rendered"] == 8

    def must_not_run(args):
        raise AssertionError("the first shard was rendered again")

    monkeypatch.setattr(synthscenes_cache, "render_synthscenes", must_not_run)
    assert ensure_synthscenes(str(out), **SCENES, needed=8) == f"{out}/synthscenes-{{000000..000000}}.tar"
    monkeypatch.setattr(synthscenes_cache, "render_synthscenes", render)
    (out / "synthscenes-000001.tar.partial").write_bytes(b"half a shard")  # what SIGKILL leaves behind
    ensure_synthscenes(str(out), **SCENES)
    assert shard_bytes(out) == reference
    assert sorted(os.listdir(out)) == sorted([*reference, "sizes.json", "synthscenes.json"])


def test_a_whole_render_of_an_older_version_is_reused_and_other_scenes_refused(tmp_path, monkeypatch):
    out = tmp_path / "train"
    ensure_synthscenes(str(out), **SCENES)
    manifest = out / "synthscenes.json"
    older = {key: value for key, value in json.loads(manifest.read_text()).items() if key != "rendered"}
    manifest.write_text(json.dumps(older))  # before folders grew: the manifest of a whole render
    monkeypatch.setattr(synthscenes_cache, "render_synthscenes", None)  # nothing may render
    assert ensure_synthscenes(str(out), **SCENES, needed=12) == f"{out}/synthscenes-{{000000..000001}}.tar"
    with pytest.raises(ValueError, match="holds SynthScenes made with"):
        ensure_synthscenes(str(out), **{**SCENES, "seed": 4}, needed=8)


@pytest.mark.filterwarnings("ignore:skipped sample")
def test_token_shards_grow_with_the_scenes(tmp_path, monkeypatch):
    vq = str(tiny_vq(0).save_pretrained(tmp_path / "vq"))
    scenes, tokens = tmp_path / "scenes", tmp_path / "tokens"
    first = ensure_synthscenes(str(scenes), **SCENES, needed=8)
    assert ensure_pretokenized(first, vq, [32], str(tokens)) == f"{tokens}/synthscenes-{{000000..000000}}.tar"
    encode = pretokenize_module.pretokenize
    encoded = []

    def logged(spec, *args, **kwargs):
        encoded.append(spec)
        return encode(spec, *args, **kwargs)

    monkeypatch.setattr(pretokenize_module, "pretokenize", logged)
    every = ensure_synthscenes(str(scenes), **SCENES)
    assert ensure_pretokenized(every, vq, [32], str(tokens)) == f"{tokens}/synthscenes-{{000000..000002}}.tar"
    assert encoded == [f"{scenes}/synthscenes-000001.tar::{scenes}/synthscenes-000002.tar"]  # the new ones
    assert ensure_pretokenized(first, vq, [32], str(tokens)) == f"{tokens}/synthscenes-{{000000..000000}}.tar"
    assert len(encoded) == 1, "a smaller spec reuses the tokens"
    encode(every, vq, [32], str(tmp_path / "at_once"))
    assert shard_bytes(tokens) == shard_bytes(tmp_path / "at_once")


def test_a_run_renders_the_training_shards_its_steps_read(tmp_path):
    assert samples_read({"max_steps": 200, "devices": 1}, 16) == 3200  # README's command 1: 4 of 40 shards
    ranks = {"devices": 2, "num_nodes": 3}
    assert samples_read({"max_steps": 5, "accumulate_grad_batches": 4, **ranks}, 2) == 240
    assert samples_read({"max_steps": 5, "devices": [0, 1]}, 2) == 20
    assert samples_read({"max_steps": -1, "max_epochs": 3, "devices": 1}, 2) is None  # all of them
    assert samples_read({"max_steps": 5, "devices": "auto"}, 2) is None
    overrides = [
        "trainer.max_steps=3",
        "data.batch_size=3",
        "data.image_size=32",
        "data.generate.train.count=32",
        "+data.generate.train.shard_size=4",
        "data.generate.val.count=8",
    ]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[f"paths.data_dir={tmp_path}", "experiment=testbed/vq", *overrides])
    data = prepare_data(cfg.data, cfg.trainer)
    # 3 steps x 3 samples: the first 3 shards of 4 scenes, of 8
    assert data.train_shards == f"{tmp_path}/synthscenes_32/train/synthscenes-{{000000..000002}}.tar"
    assert data.val_shards == f"{tmp_path}/synthscenes_32/val/synthscenes-{{000000..000000}}.tar"
    shards = [f"synthscenes-00000{i}.tar" for i in range(3)]
    rendered = sorted(os.listdir(tmp_path / "synthscenes_32" / "train"))
    assert rendered == ["sizes.json", *shards, "synthscenes.json"]
