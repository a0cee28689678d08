"""Generation at scale (docs/real_evaluation.md): every run (method + knobs) decodes every (prompt, seed) of a
prompt set, the prompts dealt over the ranks of a multi-process run (rank r takes prompts r, r + N, ...).

- Each image is written as soon as it is decoded, as a PNG in GenEval's layout under the run's folder
  (mulo_sd/evaluation/geneval_format.py: `<run>/<prompt index>/samples/<seed>.png`), then its statistics
  record is
  appended to the rank's `<run>/stats.rank<r>.jsonl` (the decode record of docs/statistics.md section 1 plus
  run, prompt, seed, batch size and `image_wall_s`, the batch's wall time over its size).
- Resumable: an image counts as done when its PNG and its record both exist, and a rerun decodes only the
  rest. A line cut short by a kill is skipped and counted, and its image decoded again.
- Throughput mode: `batch_size` > 1 decodes that many prompts together, each image with a generator of its
  own seeded with the seed (docs/batching.md), so at every batch size an image is the one `decode(method,
  models, [prompt], knobs, sampler, seed)` gives, the same as in the batch-1 speed pass, and resuming image
  by image changes no image.

The models, and how a prompt becomes a condition, stay behind mulo_sd.pipeline.decode_entry.decode.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.evaluation.geneval_format import sample_path, save_sample, write_metadata
from mulo_sd.evaluation.prompt_sets import PromptRecord
from mulo_sd.pipeline.decode_entry import decode, tensor_to_pil

STATS_GLOB = "stats.rank*.jsonl"


def run_folder_name(label: str) -> str:
    """A run label as a folder name: runs of other characters become one '_'."""
    return re.sub(r"[^A-Za-z0-9.=+-]+", "_", label).strip("_")


def run_folders(images_dir: Path, runs) -> dict[str, Path]:
    """Run label -> its image folder; two labels that give the same folder name are an error."""
    folders = {run.label: Path(images_dir) / run_folder_name(run.label) for run in runs}
    if len(set(folders.values())) != len(folders):
        raise ValueError(f"run labels {sorted(folders)} do not give distinct folder names")
    return folders


@dataclass
class GenerationCounts:
    decoded: int = 0  # images decoded by this call
    resumed: int = 0  # images of this rank's share found done and skipped
    bad_lines: int = 0  # statistics lines that could not be read (cut short by a kill): their images redone


def generate(
    models,
    runs: list,
    prompts: list[PromptRecord],
    seeds: list[int],
    sampler: SamplerConfig,
    images_dir: str | Path,
    rank: int = 0,
    world_size: int = 1,
    batch_size: int = 1,
    warmup: int = 0,
    progress: bool = True,
) -> GenerationCounts:
    """Decode this rank's share of every (run, prompt, seed) that is not done yet (module docstring).
    `runs`: mulo_sd.evaluation.runs.RunSpec; `warmup` decodes of the first batch per run, dropped, before a
    run's first timed batch (only when it has work left)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of {world_size}")
    mine = prompts[rank::world_size]
    folders = run_folders(Path(images_dir), runs)
    counts = GenerationCounts()
    work = {run.label: _pending(folders[run.label], mine, seeds, counts) for run in runs}
    total = sum(len(todo) for label in work for _, todo in work[label])
    bar = tqdm(total=total, unit="image", disable=not progress or rank != 0, file=sys.stderr)
    for run in runs:
        run_dir = folders[run.label]
        for prompt in mine:
            write_metadata(run_dir, prompt)
        batches = [
            (seed, todo[i : i + batch_size])
            for seed, todo in work[run.label]
            for i in range(0, len(todo), batch_size)
        ]
        for _ in range(warmup if batches else 0):
            seed, batch = batches[0]
            decode(run.method, models, [p.text for p in batch], run.knobs, sampler, [seed] * len(batch))
        for seed, batch in batches:
            bar.set_postfix_str(f"{run.label}, seed {seed}", refresh=False)
            _decode_batch(models, run, batch, seed, sampler, run_dir, rank)
            counts.decoded += len(batch)
            bar.update(len(batch))
    bar.close()
    return counts


def _pending(
    run_dir: Path, mine: list[PromptRecord], seeds: list[int], counts: GenerationCounts
) -> list[tuple[int, list[PromptRecord]]]:
    """(seed, the prompts of `mine` still to decode under it) per seed for one run folder; counts the images
    found done (resumed) and the unreadable statistics lines."""
    done, bad = read_records(run_dir)
    counts.bad_lines += bad
    work = [(seed, [p for p in mine if (p.index, seed) not in done]) for seed in seeds]
    counts.resumed += len(mine) * len(seeds) - sum(len(todo) for _, todo in work)
    return work


def _decode_batch(
    models, run, batch: list[PromptRecord], seed: int, sampler: SamplerConfig, run_dir: Path, rank: int
) -> None:
    """Decode one batch, write its PNGs, then append their records to the rank's statistics file (an image
    counts as done once both exist)."""
    # one generator per image, each seeded with the seed: every image is its batch-1 decode (docs/batching.md)
    captions, seeds = [p.text for p in batch], [seed] * len(batch)
    result = decode(run.method, models, captions, run.knobs, sampler, seeds, compile=run.compile)
    stats = result.stats.as_dict()
    records = []
    for prompt, image in zip(batch, result.image, strict=True):
        path = sample_path(run_dir, prompt.index, seed)
        save_sample(tensor_to_pil(image), path)
        records.append({
            "family": run.family, "label": run.label, "method": run.method,
            "knobs": json.dumps(run.knobs, sort_keys=True), "prompt_index": prompt.index,
            "prompt": prompt.text, "seed": seed, "rank": rank,
            "image": str(path.relative_to(run_dir)),
            **stats, "image_wall_s": stats["wall_s"] / len(batch),
        })  # fmt: skip
    append_records(run_dir / f"stats.rank{rank}.jsonl", records)


def append_records(path: Path, records: list[dict]) -> None:
    """Append JSON lines; a last line left unterminated by a kill is closed first: it stays one bad line."""
    with open(path, "a+b") as f:
        if f.tell() > 0:
            f.seek(-1, 2)
            if f.read(1) != b"\n":
                f.write(b"\n")
        f.write("".join(json.dumps(record) + "\n" for record in records).encode())


def read_records(run_dir: Path) -> tuple[dict[tuple[int, int], dict], int]:
    """(prompt index, seed) -> record of every finished image in a run folder (its record read from any
    rank's file, last one wins, and its PNG present), and the number of unreadable lines."""
    records, bad = {}, 0
    for path in sorted(Path(run_dir).glob(STATS_GLOB)):
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                key = (int(record["prompt_index"]), int(record["seed"]))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                bad += 1
                continue
            records[key] = record
    finished = {key: r for key, r in records.items() if (Path(run_dir) / r["image"]).is_file()}
    return finished, bad


def gather_records(
    images_dir: str | Path, runs: list, prompts: list[PromptRecord], seeds: list[int]
) -> list[dict]:
    """Every image record of every run, in run, prompt and seed order; raises when an image is missing
    (a rank that did not finish: rerun the same command to complete it)."""
    folders = run_folders(Path(images_dir), runs)
    rows = []
    for run in runs:
        done, _ = read_records(folders[run.label])
        missing = [(p.index, seed) for p in prompts for seed in seeds if (p.index, seed) not in done]
        if missing:
            raise RuntimeError(
                f"run '{run.label}' lacks {len(missing)} image(s) in {folders[run.label]}, e.g. (prompt, "
                f"seed) {missing[:3]}: rerun the same command to complete them"
            )
        rows += [done[p.index, seed] | {"path": str(folders[run.label] / done[p.index, seed]["image"])}
                 for p in prompts for seed in seeds]  # fmt: skip
    return rows
