"""DPG-Bench's image layout, so its official scorer (TencentQQGYLab/ELLA, dpg_bench/compute_dpg_bench.py)
runs on a run's folder unchanged:

    <out_dir>/dpg_bench/<run>/
        <item_id>.png       per prompt one PNG: a 2 x 2 grid of the prompt's first four seeds' images,
                            seeds[0] top left, seeds[1] top right, seeds[2] bottom left, seeds[3] bottom right

The scorer lists every file of the folder, takes a file's name up to its first '.' as the prompt's
`item_id` (the prompt file's name in dpg_bench/prompts/), and crops cell k at (x, y) = (k % 2, k // 2) x
`--resolution` for the first `--pic-num` cells (dist_eval.sh: 4). So the folder holds the grids only, and
`--resolution` is one image's side. With fewer than four seeds the missing cells stay black: pass
`PIC_NUM=<number of seeds>`.

The images themselves are generated one by one in GenEval's layout (sharded, resumable:
mulo_sd/evaluation/generation.py); the grids are put together from them once every rank has finished, and a
grid already on disk is kept, so a rerun only adds the missing ones.
"""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from mulo_sd.evaluation.geneval_format import save_sample
from mulo_sd.evaluation.prompt_sets import PromptRecord

CELLS = 4  # the scorer's 2 x 2 grid


def grid_path(run_dir: Path, prompt: PromptRecord) -> Path:
    item_id = prompt.metadata.get("item_id")
    if not item_id or "." in item_id:
        raise ValueError(f"prompt {prompt.index} has no DPG-Bench item_id without a '.': {item_id!r}")
    return run_dir / f"{item_id}.png"


def dpg_grid(images: list[Image.Image]) -> Image.Image:
    """The 2 x 2 grid of up to four equal square images, in the scorer's cell order."""
    if not 1 <= len(images) <= CELLS:
        raise ValueError(f"a DPG-Bench grid holds 1 to {CELLS} images, got {len(images)}")
    side = images[0].width
    if any(image.size != (side, side) for image in images):
        raise ValueError(f"a DPG-Bench grid needs square images of one size, got {[i.size for i in images]}")
    grid = Image.new("RGB", (2 * side, 2 * side))
    for k, image in enumerate(images):
        grid.paste(image.convert("RGB"), ((k % 2) * side, (k // 2) * side))
    return grid


def write_dpg_grids(
    rows: list[dict], prompts: list[PromptRecord], seeds: list[int], run_dirs: dict[str, Path]
) -> dict[str, int]:
    """Write each run's missing grids into `run_dirs[label]` from the gathered image records `rows`
    (with their "path"); label -> grids written now."""
    by_key = {(row["label"], row["prompt_index"], row["seed"]): Path(row["path"]) for row in rows}
    written = {}
    for label, run_dir in run_dirs.items():
        written[label] = 0
        for prompt in prompts:
            path = grid_path(run_dir, prompt)
            if path.is_file():
                continue
            cells = []
            for seed in seeds[:CELLS]:
                with Image.open(by_key[label, prompt.index, seed]) as image:
                    cells.append(image.convert("RGB"))
            save_sample(dpg_grid(cells), path)
            written[label] += 1
    return written


def list_grids(run_dir: Path) -> dict[str, Path]:
    """item_id -> grid of every file in the folder, named the way the scorer names them."""
    return {path.name.split(".")[0]: path for path in sorted(Path(run_dir).iterdir())}
