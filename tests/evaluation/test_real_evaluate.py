import os
import socket
import subprocess
import sys
import time

import pytest
import torch
from mulo_sd.training.evaluate import run
from omegaconf import OmegaConf
from PIL import Image

from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.evaluation.generation import gather_records, generate, read_records
from mulo_sd.evaluation.prompt_sets import load_prompt_set
from mulo_sd.evaluation.real_evaluate import matched_split_table, prompt_splits
from mulo_sd.evaluation.runs import RunSpec, expand_runs, reference_run
from mulo_sd.nets.safe_files import UnsafePickleError
from mulo_sd.pipeline.testbed_models import load_models
from tests.helpers import read_csv
from tests.pickle_fixtures import save_hostile
from tests.real_eval_helpers import (
    TINY_HPS_MODEL,
    save_tiny_clip,
    save_tiny_extractor,
    save_tiny_hps,
    synthscenes_captions,
    write_prompt_files,
)
from tests.training.test_decode_cli import compose, save_tiny_testbed

RUNS = "runs=[{family:AR,method:ar},{family:ZipAR,method:zipar,sweep:{window:[2,4]}}]"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny testbed, prompt files of every format, a .pt2 FID extractor, a CLIP folder and an HPS file."""
    root = tmp_path_factory.mktemp("real")
    return {
        "hps": save_tiny_hps(root / "hps" / "HPS_v2.1_compressed.pt"),
        "testbed": save_tiny_testbed(root / "testbed"),
        "prompts": write_prompt_files(root / "prompts", synthscenes_captions(8)),
        "extractor": save_tiny_extractor(root / "extractor.pt2"),
        "clip": save_tiny_clip(root / "clip"),
    }


def coco_overrides(files, out_dir):
    coco = files["prompts"]["coco"]
    return [
        "eval=coco5k", RUNS, "models=folder", f"models.root={files['testbed']}", "warmup=0", "progress=false",
        f"out_dir={out_dir}",
        f"prompts.file={coco['path']}", f"prompts.images={coco['images']}", "prompts.count=6",
        f"fid.extractor={files['extractor']}", f"clip.model={files['clip']}", "speed.prompts=2",
        f"hps.checkpoint={files['hps']}",
        f"hps.model={files['hps'].parent / 'open_clip_configs' / TINY_HPS_MODEL}.json",
        "grid_prompts=2", "matched.tolerance=100", "matched.dev_prompts=3",
    ]  # fmt: skip


def test_coco_evaluation_with_fid_clip_speed_and_a_dev_test_split(files, tmp_path):
    out = tmp_path / "out"
    result = run(compose("evaluate", tmp_path, coco_overrides(files, out)))
    names = {p.name for p in out.iterdir()}
    expected = {"images", "images.csv", "runs.csv", "summary.csv", "summary.md", "speed_quality.png",
                "matched.md", "grid_seed0.png", "fid_reference.npz", "speed", "paper_table.md"}  # fmt: skip
    assert expected <= names
    images = read_csv(out / "images.csv")
    assert len(images) == 3 * 6  # 3 runs x 6 prompts x 1 seed
    assert all(-1 <= float(row["hpsv2"]) <= 1 for row in images)  # HPSv2 per image
    summary = read_csv(out / "summary.csv")
    splits = prompt_splits(load_prompt_set(files["prompts"]["coco"]["path"], "coco", count=6).prompts, 3, 0)
    assert [(row["split"], row["label"]) for row in summary] == [
        (split, label) for split in ("dev", "test") for label in ("AR", "ZipAR window=2", "ZipAR window=4")
    ]
    for row in summary:
        assert row["images"] == "3" and float(row["throughput_img_s"]) > 0 and float(row["fid"]) > 0
        assert 0 <= float(row["clip_score"]) <= 100 and float(row["speedup_median"]) > 0
        assert (
            row["fid_protocol"].startswith("llamagen (centre-cropped square")
            and "256 px" in row["fid_protocol"]
        )
        per_image = [float(r["hpsv2"]) for r in images if r["label"] == row["label"]
                     and int(r["prompt_index"]) in {p.index for p in splits[row["split"]]}]  # fmt: skip
        assert float(row["hpsv2"]) == pytest.approx(sum(per_image) / len(per_image))
    assert {row["speedup_median"] for row in summary if row["label"] == "AR"} == {"1.0"}
    dev, test = splits["dev"], splits["test"]
    speed = read_csv(out / "runs.csv")  # batch 1, the first 2 prompts of each split
    assert sorted({int(row["prompt_index"]) for row in speed}) == sorted(p.index for p in dev[:2] + test[:2])
    header = (out / "summary.md").read_text()
    assert "3 dev prompts pick each method's setting, 3 disjoint test prompts report it" in header
    assert "FID protocol: llamagen (" in header and "HPSv2: HPS_v2.1_compressed.pt" in header
    paper = (out / "paper_table.md").read_text()
    assert "# The paper's table (the 3 test prompts)" in paper and "FID protocol: llamagen (" in paper
    columns = "method | setting | speedup | geneval | geneval_layout | dpg_layout | fid | hpsv2 | clip_score"
    assert f"| {columns} |" in paper
    zipar = next(line for line in paper.splitlines() if line.startswith("| ZipAR | window=2 | "))
    assert f" | {out / 'images' / 'ZipAR_window=2'} | - | " in zipar  # GenEval's layout; no DPG grids
    matched = (out / "matched.md").read_text()
    assert "on the dev prompts" in matched and "its numbers are from the disjoint test prompts" in matched
    dev_zipar = [row for row in summary if row["split"] == "dev" and row["label"].startswith("ZipAR")]
    fastest = max(dev_zipar, key=lambda row: float(row["speedup_median"]))["label"]
    assert result.matched[1]["setting"] == fastest.removeprefix("ZipAR ")  # tolerance 100: the fastest on dev
    test_rows = {row["label"]: row for row in summary if row["split"] == "test"}
    assert result.matched[1]["fid"] == pytest.approx(float(test_rows[fastest]["fid"]))
    assert result.matched[1]["speedup"] == pytest.approx(float(test_rows[fastest]["speedup_median"]))
    grid = Image.open(out / "grid_seed0.png")
    assert grid.size[1] > grid.size[0]  # real + 3 runs rows, 2 columns


@pytest.mark.parametrize("preset", ["coco5k", "geneval", "dpg_bench"])
def test_real_prompt_presets_expand_to_valid_runs(files, tmp_path, preset):
    cfg = compose(
        "evaluate", tmp_path, [f"eval={preset}", "models=folder", f"models.root={files['testbed']}"]
    )
    runs = expand_runs(OmegaConf.to_container(cfg.runs, resolve=True))  # raises on an unknown knob
    formats = {"coco5k": "coco", "geneval": "geneval", "dpg_bench": "dpg"}
    assert reference_run(runs).method == "ar" and cfg.prompts.format == formats[preset]
    if preset == "coco5k":
        assert cfg.prompts.count == 5000 and cfg.matched.dev_prompts == 1000
        assert cfg.fid.reference == cfg.prompts.images
        assert cfg.fid.protocol == "llamagen" and cfg.fid.resolution == 256
    if preset == "dpg_bench":
        assert list(cfg.seeds) == [0, 1, 2, 3] and cfg.prompts.count is None


def test_missing_metric_files_fail_before_any_decode(files, tmp_path, monkeypatch):
    import mulo_sd.evaluation.generation as generation

    monkeypatch.setattr(generation, "decode", None)  # any decode would fail with a TypeError instead
    overrides = [*coco_overrides(files, tmp_path / "out"), f"fid.extractor={tmp_path / 'inception.pth'}"]
    with pytest.raises(FileNotFoundError, match=r"FID feature extractor not found: .*inception\.pth"):
        run(compose("evaluate", tmp_path, overrides))
    overrides = [*coco_overrides(files, tmp_path / "out"), f"clip.model={tmp_path / 'clip'}"]
    with pytest.raises(FileNotFoundError, match=r"CLIP model folder not found"):
        run(compose("evaluate", tmp_path, overrides))


def test_an_empty_prompt_file_a_bad_seed_or_an_unsafe_inception_fail_before_any_model_loads(
    files, tmp_path, monkeypatch
):
    import mulo_sd.training.evaluate_prompts as evaluate_prompts

    def refuse(*args, **kwargs):
        raise AssertionError("a model loaded")

    monkeypatch.setattr(evaluate_prompts, "load_model_set", refuse)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    as_lines = [f"prompts.file={empty}", "prompts.format=lines", "prompts.count=null", "prompts.images=null"]
    overrides = [*coco_overrides(files, tmp_path / "out"), *as_lines]
    with pytest.raises(ValueError, match=rf"prompts.file={empty} holds no lines prompts \(2 skipped: blank"):
        run(compose("evaluate", tmp_path, overrides))
    overrides = [*coco_overrides(files, tmp_path / "out"), "seeds=[99999999999999999999999]"]
    with pytest.raises(ValueError, match=r"seeds=\[99999999999999999999999\] holds .*\[0, 2\*\*63-1\]"):
        run(compose("evaluate", tmp_path, overrides))
    marker = tmp_path / "marker"
    save_hostile(tmp_path / "inception.pth", marker)
    overrides = [*coco_overrides(files, tmp_path / "out"), f"fid.extractor={tmp_path / 'inception.pth'}"]
    with pytest.raises(
        UnsafePickleError, match=r"inception\.pth needs .*open'\].*pass fid\.trust_pickle=true"
    ):
        run(compose("evaluate", tmp_path, overrides))
    assert not marker.exists()
    assert compose("evaluate", tmp_path, [*overrides, "fid.trust_pickle=true"]).fid.trust_pickle is True


def test_matched_split_table_picks_on_dev_and_reports_test():
    def entry(split, family, setting, speedup, score):
        label = f"{family} {setting}".strip()
        return {"split": split, "family": family, "label": label, "method": "ar" if family == "AR" else "x",
                "speedup_median": speedup, "speedup_of_medians": speedup, "step_ratio_median": speedup,
                "clip_score": score, "fid": 10.0 + speedup}  # fmt: skip

    summary = [
        entry("dev", "AR", "", 1.0, 30.0),
        entry("dev", "M", "tau=0.1", 2.0, 29.8),
        entry("dev", "M", "tau=0.3", 3.0, 28.0),  # fastest, but too far from AR on the dev prompts
        entry("test", "AR", "", 1.0, 31.0),
        entry("test", "M", "tau=0.1", 2.2, 30.5),
        entry("test", "M", "tau=0.3", 3.1, 31.0),  # would match on the test prompts: never looked at
    ]
    table = matched_split_table(summary, "clip_score", 0.5)
    assert [
        (row["method"], row["setting"], row["clip_score_dev"], row["speedup"], row["clip_score"])
        for row in table
    ] == [
        ("AR", "-", 30.0, 1.0, 31.0),
        ("M", "tau=0.1", 29.8, 2.2, 30.5),
    ]
    assert table[1]["fid"] == 12.2
    with pytest.raises(ValueError, match=r"matched quality needs 'fid_x' in every summary row"):
        matched_split_table(summary, "fid_x", 0.5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_rank_generation(rank, port, testbed, prompt_files, out):
    """One rank of a 2-process group: generate 8 prompts of every format, rank 0 then gathers them."""
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from mulo_sd.evaluation.ranks import barrier, close_ranks, init_ranks

    torch.set_num_threads(1)
    rank, world_size, device = init_ranks("cpu")
    models = load_models(testbed, names=["vq", "target"])
    runs = [RunSpec("ar", family="AR")]
    for name, entry in prompt_files.items():
        prompts = load_prompt_set(entry["path"], name, count=8).prompts
        generate(models, runs, prompts, [0], SamplerConfig(), out / name, rank, world_size, progress=False)
        barrier()
        if rank == 0:
            rows = gather_records(out / name, runs, prompts, [0])
            assert [row["prompt_index"] for row in rows] == list(range(8))
    close_ranks()


@pytest.mark.slow
def test_two_processes_share_8_prompts_of_every_format(files, tmp_path):
    out = tmp_path / "out"
    torch.multiprocessing.spawn(
        _two_rank_generation, args=(_free_port(), files["testbed"], files["prompts"], out), nprocs=2
    )
    for name in files["prompts"]:
        records, bad = read_records(out / name / "AR")
        assert bad == 0 and sorted(records) == [(i, 0) for i in range(8)]
        assert {key: r["rank"] for key, r in records.items()} == {(i, 0): i % 2 for i in range(8)}


@pytest.mark.slow
def test_torchrun_two_process_evaluation_matches_one_process(files, tmp_path):
    overrides = coco_overrides(files, tmp_path / "two")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
               f"--master_port={_free_port()}", "-m", "mulo_sd.training.evaluate", *overrides,
               f"paths.log_dir={tmp_path}/logs"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(command, check=True, cwd=tmp_path, env=env, capture_output=True, timeout=600)
    records = read_csv(tmp_path / "two" / "images.csv")
    assert sorted({row["rank"] for row in records}) == ["0", "1"]
    run(compose("evaluate", tmp_path, coco_overrides(files, tmp_path / "one")))
    # batch 1, same seeds: the same images, so the same FID and CLIP score whatever the number of ranks
    one, two = (read_csv(tmp_path / name / "summary.csv") for name in ("one", "two"))
    for a, b in zip(one, two, strict=True):
        assert a["fid"] == b["fid"] and a["clip_score"] == b["clip_score"]


def _rank_of_an_evaluation(rank, port, overrides, tmp_path):
    """One rank of a 2-process `mulo-eval`; its error (if any) is written to rank<rank>.error."""
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        run(compose("evaluate", tmp_path / f"rank{rank}", overrides))
    except Exception as error:
        (tmp_path / f"rank{rank}.error").write_text(f"{type(error).__name__}: {error}")


@pytest.mark.slow
def test_a_missing_metric_file_stops_every_rank_before_any_decode(files, tmp_path):
    out = tmp_path / "out"
    overrides = [*coco_overrides(files, out), f"clip.model={tmp_path / 'no_clip'}"]
    ranks = torch.multiprocessing.spawn(
        _rank_of_an_evaluation, args=(_free_port(), overrides, tmp_path), nprocs=2, join=False
    )
    deadline = time.monotonic() + 120  # spawning and importing take most of it; decoding would take longer
    while not ranks.join(timeout=5):
        if time.monotonic() > deadline:
            for process in ranks.processes:
                process.kill()
            pytest.fail("a rank went on past the missing CLIP folder")
    for rank in (0, 1):  # each rank found it missing itself
        assert "CLIP model folder not found" in (tmp_path / f"rank{rank}.error").read_text()
    assert not list(out.rglob("*.png"))
