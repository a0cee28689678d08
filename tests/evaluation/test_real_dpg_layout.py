import numpy as np
import pytest
from mulo_sd.training.evaluate import run
from PIL import Image

from mulo_sd.evaluation.dpg_format import dpg_grid, list_grids
from mulo_sd.evaluation.geneval_format import sample_path
from mulo_sd.evaluation.prompt_sets import load_prompt_set
from tests.helpers import read_csv
from tests.real_eval_helpers import (
    TINY_HPS_MODEL,
    save_tiny_hps,
    synthscenes_captions,
    write_dpg_prompts,
)
from tests.training.test_decode_cli import compose, save_tiny_testbed

RUNS = "runs=[{family:AR,method:ar},{family:ZipAR,method:zipar,knobs:{window:2}}]"


def test_dpg_prompt_folder_reads_numbered_then_named_item_ids(tmp_path):
    folder = write_dpg_prompts(tmp_path / "prompts", ["a", "b", "c", "d"])  # ids 10, 7, 4, COCOval...
    (folder / "1.txt").write_text("  \n")
    prompt_set = load_prompt_set(folder, "dpg")
    assert [(p.index, p.metadata["item_id"], p.text) for p in prompt_set.prompts] == [
        (0, "4", "c"), (1, "7", "b"), (2, "10", "a"), (3, "COCOval2014000000010363", "d"),
    ]  # fmt: skip
    assert (prompt_set.skipped, prompt_set.skip_reason) == (1, "empty prompt files")
    with pytest.raises(FileNotFoundError, match=r"DPG-Bench prompt folder \(ELLA's dpg_bench/prompts\)"):
        load_prompt_set(tmp_path / "nope", "dpg")


def test_a_grid_holds_the_seeds_in_the_scorers_cell_order():
    cells = [Image.new("RGB", (4, 4), (40 * k, 0, 0)) for k in range(3)]
    grid = np.asarray(dpg_grid(cells))
    assert grid.shape == (8, 8, 3)
    # compute_dpg_bench.py crops (0,0,R,R), (R,0,2R,R), (0,R,R,2R), (R,R,2R,2R)
    assert [grid[1, 1, 0], grid[1, 5, 0], grid[5, 1, 0], grid[5, 5, 0]] == [0, 40, 80, 0]
    with pytest.raises(ValueError, match=r"a DPG-Bench grid holds 1 to 4 images, got 5"):
        dpg_grid(cells + cells[:2])


def test_dpg_bench_preset_writes_the_layout_its_scorer_reads_and_resumes(tmp_path, monkeypatch):
    testbed = save_tiny_testbed(tmp_path / "testbed")
    prompts = write_dpg_prompts(tmp_path / "dpg_bench" / "prompts", synthscenes_captions(3))
    hps = save_tiny_hps(tmp_path / "hps" / "HPS_v2.1_compressed.pt")
    out = tmp_path / "out"
    overrides = [
        "eval=dpg_bench", RUNS, "models=folder", f"models.root={testbed}", "warmup=0", "progress=false",
        f"prompts.file={prompts}", f"out_dir={out}", "speed.prompts=1", "grid_prompts=0",
        f"hps.checkpoint={hps}", f"hps.model={hps.parent / 'open_clip_configs' / TINY_HPS_MODEL}.json",
    ]  # fmt: skip
    run(compose("evaluate", tmp_path, overrides))
    item_ids = [p.metadata["item_id"] for p in load_prompt_set(prompts, "dpg").prompts]
    for run_folder in ("AR", "ZipAR_window=2"):
        grids = list_grids(out / "dpg_bench" / run_folder)
        assert sorted(grids) == sorted(item_ids)  # the folder holds the grids and nothing else
        for index, item_id in enumerate(item_ids):
            grid = Image.open(grids[item_id])
            assert grid.size == (32, 32)  # 2 x 2 of the 16 px images: --resolution 16
            for k in range(4):  # seeds 0-3, cells left to right, top to bottom
                cell = grid.crop(((k % 2) * 16, (k // 2) * 16, (k % 2) * 16 + 16, (k // 2) * 16 + 16))
                image = Image.open(sample_path(out / "images" / run_folder, index, k))
                assert np.array_equal(np.asarray(cell), np.asarray(image.convert("RGB")))
    summary = read_csv(out / "summary.csv")
    assert [row["label"] for row in summary] == ["AR", "ZipAR window=2"]
    assert all(-1 <= float(row["hpsv2"]) <= 1 and row["images"] == "12" for row in summary)
    paper = (out / "paper_table.md").read_text()
    assert f"| {out / 'images' / 'ZipAR_window=2'} | {out / 'dpg_bench' / 'ZipAR_window=2'} |" in paper
    # resume: nothing is decoded again, a kept grid is not rewritten, a deleted one comes back the same
    import mulo_sd.evaluation.generation as generation

    kept, removed = (out / "dpg_bench" / "AR" / f"{item_ids[i]}.png" for i in (0, 1))
    before, removed_bytes, mtime = kept.read_bytes(), removed.read_bytes(), kept.stat().st_mtime_ns
    removed.unlink()
    monkeypatch.setattr(generation, "decode", None)  # any decode would fail with a TypeError
    run(compose("evaluate", tmp_path, [*overrides, "speed.prompts=0"]))
    assert kept.stat().st_mtime_ns == mtime and kept.read_bytes() == before
    assert removed.read_bytes() == removed_bytes
