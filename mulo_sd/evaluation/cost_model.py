"""A real-size cost model: predicted wall time per image and speedup over AR of every method at the sizes of
LlamaGen-XL t2i 512 px and Tar AR-DTok 1024 px, from random-weight models of those sizes timed per kind of
call and the call schedules the methods record on the testbed (docs/cost_model.md).

    python -m mulo_sd.evaluation.cost_model --size real --out cost_model        # cost_model.{csv,md}
    python -m mulo_sd.evaluation.cost_model --size tiny --prompts 1             # the smoke test (seconds)

Why it works: the time of a model call does not depend on the weights' values, only on the shapes, so
models of the real sets' shapes with random weights time what the trained ones would. The slot cache
(mulo_sd/nets/slot_cache.py) attends over all S slots of the state with a mask, so a call's cost depends on
the tokens it is fed (n) and the model's fixed S, not on where in the grid it writes: `step` is timed once
per n at one state.

1. Timings (inputs). For each real set (`real_sets`): the target, MuLo-SD's drafter (the set's low-res
   GPT: LlamaGen's 256 px XL for r=2; Tar's 256 px AR-DTok for r=4), LANTERN's same-resolution small
   drafter (none ships: a GPT-B-size model, dim 768, 12 layers, 12 heads, at the target's grid, an
   assumption), the EAGLE-2 head for the target (one block at the target's width) and the learned
   up-/down-sampler of the set's experiment configs (conf/experiment/{llamagen,tar}/), built with random
   weights (bfloat16 GPTs on CUDA, float32 on CPU; the samplers stay float32, as the sets load them) and
   put under the set's guidance scale (cfg 7.5 / 4: the GPTs' calls carry 2 rows). Each kind of call the
   predicted schedules contain is timed: `start` (the condition prefix: 120 T5 / 729 TA-Tok slots), `step`
   feeding n tokens for n at powers of `--base` (2) between the smallest and the largest n of the
   schedules plus that largest n itself, linearly interpolated in n in between (a full-grid verification
   is timed at its own n); a tree verification (`step_tree`) is timed as a `step` of as many tokens (its
   S grows by the tree slots only); the head's `step`; the up-sampler's `upsample_rows` and the
   down-sampler's `downsample` on grids of n tokens (whole rows). Timing: one warm-up call, then the median
   of `--repeats` calls, CUDA synchronised around each; a warm-up call slower than `--slow-s` is the
   measurement itself (CPU-size calls of a minute are not repeated).

2. Schedules. Every model call of a decode is recorded as (kind, tokens fed) in `DecodeStats.calls`
   (mulo_sd/decoding/stats.py, methods/instrumented.py). AR and ZipAR at the real size are exact: AR is one
   `start` and h*w - 1 steps of one token; ZipAR's (window of RECOMMENDED) is recorded by running
   `decode_zipar` on a one-layer stand-in GPT of the real grid (its schedule depends on the grid and window
   only). The speculative methods' schedules depend on acceptance, so they are recorded on the testbed
   (16x16 target; 8x8 / 4x4 drafters) over `--prompts` test prompts (testbed/prompts.py
   `evaluation_prompts`, one image per decode, seed = prompt index, the testbed sampler: cfg 2), each
   method at RECOMMENDED knobs (MuLo-SD 2x and 4x with the default set's samplers), and scaled to the real
   grid.

3. Scaling rule (an ASSUMPTION, to be checked against 32x32 testbed schedules when those exist): let
   s = real target side / testbed target side (LlamaGen 32/16 = 2, Tar 64/16 = 4) and a = s^2. `start`
   calls are kept as they are (one per model). MuLo-SD (its testbed schedule with the drafter of the set's
   r: 2x for LlamaGen, 4x for Tar): every drafter step becomes s steps feeding s times its tokens (diagonal
   ZipAR drafting: the anti-diagonals of an s times larger grid are s times as many and s times as long);
   target verification and island-resampling calls keep their count per cycle, each fed a times its tokens
   (capped at the grid); the cycle count is unchanged; up-/down-sampler calls keep their count, fed a times
   their tokens. LANTERN and EAGLE-2 keep their accepted tokens per cycle, so every non-`start` call of
   theirs is repeated a times with its tokens unchanged. Predicted seconds per image are the sum over the
   scaled schedule of the timed cost of each call (mean over the prompts); the sequential calls are its
   length; the speedup is AR's predicted seconds over the method's. Not counted: sampling, the accept rule,
   the island search and other host work between the calls, and the EAGLE-2 head's logits through the
   target's output layer. The tokenizer's image decode is the same for every method and left out.

Code: this module (the prediction and the command), cost_schedules.py (the real sets' shapes, the schedules,
the scaling rule), cost_timing.py (timing). CPU timings predict CPU wall time only; GPU predictions come
from running this on a GPU (`--device cuda`, bfloat16 by default).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from mulo_sd.evaluation.cost_schedules import (
    EXACT,
    METHODS,
    TESTBED_SIDE,
    RealSet,
    Schedule,
    ar_schedule,
    load_schedules,
    real_sets,
    save_schedules,
    scale_schedule,
    testbed_schedules,
    zipar_schedule,
)  # fmt: skip
from mulo_sd.evaluation.cost_timing import Timer, bucket_points, interpolate
from mulo_sd.evaluation.tables import markdown_table
from mulo_sd.evaluation.writers import write_csv
from mulo_sd.pipeline.decode_entry import RECOMMENDED

PREDICTION_COLUMNS = (
    "set", "method", "schedule", "sequential_calls", "seconds_per_image", "speedup_vs_ar",
)  # fmt: skip
TIMING_COLUMNS = ("set", "model", "call", "tokens", "seconds")


# which real model and call each recorded kind of a method runs on
def _model_of(method: str, kind: str, real: RealSet) -> tuple[str, str]:
    role, _, call = kind.partition(".")
    call = "step" if call in ("step", "step_tree", "step_rows", "") else call
    # a sampled draft (draft_temperature > 0) runs the same forward as the argmax one; its draw is not timed
    call = "upsample_rows" if call == "upsample_rows_logits" else call
    if role == "target":
        return "target", call
    if role == "drafter":
        drafters = {"mulo": f"drafter_r{real.r}", "lantern": "drafter_small", "eagle2": "eagle_head"}
        return drafters[method], call
    return f"{role}_r{real.r}", call


def predict_set(
    real: RealSet,
    schedules: dict[str, list[Schedule]],
    timer: Timer,
    base: int = 2,
    methods=METHODS,
) -> tuple[list[dict], list[dict]]:
    """-> (prediction rows, timing rows) of one real set (module docstring)."""
    s = real.side // TESTBED_SIDE
    caps = {
        "target": real.target.num_tokens,
        "drafter": real.drafter.num_tokens,
        "upsampler": real.drafter.num_tokens,
        "downsampler": real.target.num_tokens,
    }
    predicted: dict[str, tuple[str, list[Schedule]]] = {}  # label -> (method, schedules per image)
    for label, method, knobs in methods:
        if method == "ar":
            predicted[label] = (method, [ar_schedule(real.target.grid_size)])
        elif method == "zipar":
            window = knobs.get("window", RECOMMENDED["zipar"]["window"])
            predicted[label] = (method, [zipar_schedule(real.target.grid_size, window)])
        elif method == "mulo" and knobs.get("r", RECOMMENDED["mulo"]["r"]) != real.r:
            continue  # the set has no drafter of that scale
        elif label in schedules:
            scaled = {**caps, "drafter": real.small_drafter.num_tokens} if method == "lantern" else caps
            if method == "eagle2":
                scaled = {**caps, "drafter": real.target.num_tokens}
            predicted[label] = (method, [scale_schedule(method, c, s, scaled) for c in schedules[label]])
    needed: dict[tuple[str, str], set[int]] = {}
    for method, per_image in predicted.values():
        for calls in per_image:
            for kind, n in calls:
                needed.setdefault(_model_of(method, kind, real), set()).add(n)
    _time_needed(real, needed, timer, base)
    rows, ar_seconds = [], None
    for label, (method, per_image) in predicted.items():
        seconds = [schedule_seconds(timer, real, method, calls) for calls in per_image]
        mean = statistics.fmean(seconds)
        ar_seconds = mean if method == "ar" else ar_seconds
        rows.append({
            "set": real.name, "method": label, "schedule": "exact" if method in EXACT else f"scaled s={s}",
            "sequential_calls": round(statistics.fmean(len(c) for c in per_image), 1),
            "seconds_per_image": mean,
        })  # fmt: skip
    for row in rows:
        row["speedup_vs_ar"] = round(ar_seconds / row["seconds_per_image"], 2) if ar_seconds else ""
    timing_rows = [
        {"set": real.name, "model": name.split("/", 1)[1], "call": call, "tokens": n, "seconds": t}
        for (name, call), points in sorted(timer.timings.items())
        if name.startswith(real.name + "/")
        for n, t in sorted(points.items())
    ]
    return rows, timing_rows


def schedule_seconds(timer: Timer, real: RealSet, method: str, calls: Schedule) -> float:
    """Predicted seconds of a real-size schedule: the sum of its calls' interpolated timings."""
    total = 0.0
    for kind, n in calls:
        model, call = _model_of(method, kind, real)
        total += interpolate(timer.timings[(f"{real.name}/{model}", call)], n)
    return total


def _time_needed(real: RealSet, needed: dict[tuple[str, str], set[int]], timer: Timer, base: int) -> None:
    def points(key):
        ns = sorted(needed.get(key, ()))
        return bucket_points(ns, base) if ns else []

    gpts = {
        "target": real.target,
        f"drafter_r{real.r}": real.drafter,
        "drafter_small": real.small_drafter,
    }
    for model, config in gpts.items():
        calls = {}
        if (model, "start") in needed:
            calls["start"] = [0]
        if (model, "step") in needed:
            calls["step"] = points((model, "step"))
        if calls:
            timer.log(f"{real.name}: {model}")
            timer.gpt(f"{real.name}/{model}", config, real.cfg_scale, calls)
    if ("eagle_head", "step") in needed:
        timer.log(f"{real.name}: eagle_head")
        timer.head(f"{real.name}/eagle_head", real.head, real.cfg_scale, points(("eagle_head", "step")))
    if ("eagle_head", "start") in needed:  # allocation only: free next to the calls
        timer.timings[(f"{real.name}/eagle_head", "start")] = {0: 0.0}
    up = (f"upsampler_r{real.r}", "upsample_rows")
    if up in needed:
        timer.log(f"{real.name}: {up[0]}")
        timer.upsampler(f"{real.name}/{up[0]}", real.upsampler, real.drafter.grid_size, points(up))
    down = (f"downsampler_r{real.r}", "downsample")
    if down in needed:
        timer.log(f"{real.name}: {down[0]}")
        timer.downsampler(f"{real.name}/{down[0]}", real.downsampler, real.target.grid_size, points(down))
    missing = [key for key in needed if (f"{real.name}/{key[0]}", key[1]) not in timer.timings]
    if missing:
        raise ValueError(f"{real.name}: no timing for the calls {missing}")


# ---- command ------------------------------------------------------------------------------------------


def run(
    size: str = "real",
    device: str | None = None,
    dtype: str | None = None,
    prompts: int = 16,
    repeats: int = 3,
    slow_s: float = 5.0,
    base: int = 2,
    sets: list[str] | None = None,
    methods=METHODS,
    log=print,
    schedules_file: str | Path | None = None,
) -> tuple[list[dict], list[dict]]:
    """-> (prediction rows, timing rows) over the real sets whose names start with any of `sets`
    (None: all). schedules_file: a JSON of the testbed schedules, read when it exists (recorded with as
    many prompts as it holds), else recorded and written there."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, dtype) if dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    if schedules_file is not None and Path(schedules_file).exists():
        log(f"testbed schedules: read from {schedules_file}")
        schedules = load_schedules(schedules_file)
    else:
        log(f"testbed schedules: {prompts} test prompts")
        schedules = testbed_schedules(prompts, methods)
        if schedules_file is not None:
            save_schedules(schedules_file, schedules)
    timer = Timer(device, dtype, repeats, slow_s, log)
    rows, timing_rows = [], []
    for real in real_sets(size):
        if sets and not any(real.name.lower().startswith(name.lower()) for name in sets):
            continue
        predicted, timed = predict_set(real, schedules, timer, base, methods)
        rows += predicted
        timing_rows += timed
    return rows, timing_rows


def report(rows: list[dict], timing_rows: list[dict], header: str = "") -> str:
    return "\n\n".join(
        part for part in (
            header,
            "Predicted per image (one image per decode, guidance on):\n\n"
            + markdown_table(rows, PREDICTION_COLUMNS),
            "Per-call timings used (seconds; tokens = tokens fed):\n\n"
            + markdown_table(timing_rows, TIMING_COLUMNS),
        ) if part
    )  # fmt: skip


def machine_description(device: torch.device, dtype: torch.dtype) -> str:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = "CPU"
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        name += f", {torch.get_num_threads()} threads"
    dtype_name = str(dtype).removeprefix("torch.")
    return f"device: {device.type} ({name}), dtype {dtype_name}, torch {torch.__version__}"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mulo_sd.evaluation.cost_model",
        description="Predict each method's wall time per image and speedup over AR at LlamaGen-XL 512 px and "
        "Tar AR-DTok 1024 px sizes: random-weight models of those sizes timed per call kind, replaying call "
        "schedules recorded on the testbed (scaling rule: the module docstring, docs/cost_model.md).",
    )
    parser.add_argument(
        "--size",
        choices=("real", "tiny"),
        default="real",
        help="real: the sets' shapes; tiny: the same structure, small widths (a smoke test)",
    )
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    parser.add_argument(
        "--dtype", default=None, help="the GPTs' dtype (default: bfloat16 on CUDA, float32 on CPU)"
    )
    parser.add_argument("--out", default=None, help="write <out>.csv, <out>_timings.csv and <out>.md")
    parser.add_argument("--prompts", type=int, default=16, help="testbed test prompts to record schedules on")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls after the warm-up (median)")
    parser.add_argument(
        "--slow-s",
        type=float,
        default=5.0,
        help="a warm-up call slower than this is the measurement (no repeats)",
    )
    parser.add_argument("--base", type=int, default=2, help="token buckets: powers of this (interpolated)")
    parser.add_argument(
        "--sets",
        nargs="*",
        default=None,
        help="only the real sets whose names start with these (e.g. LlamaGen Tar)",
    )
    parser.add_argument(
        "--schedules",
        default=None,
        help="JSON of the testbed schedules: read if it exists, else recorded and written",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)  # fmt: skip
    if args.base < 2 or args.prompts < 1 or args.repeats < 1:
        parser.error("--base must be >= 2, --prompts and --repeats >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, args.dtype) if args.dtype else (
        torch.bfloat16 if device.type == "cuda" else torch.float32
    )  # fmt: skip
    start = time.perf_counter()

    def log(message):
        print(f"[{time.perf_counter() - start:7.1f}s] {message}", file=sys.stderr, flush=True)

    rows, timing_rows = run(
        args.size, str(device), str(dtype).removeprefix("torch."), args.prompts, args.repeats, args.slow_s,
        args.base, args.sets, log=log, schedules_file=args.schedules,
    )  # fmt: skip
    header = (
        f"Cost model, size {args.size}; {machine_description(device, dtype)}; schedules from "
        f"{args.schedules or f'{args.prompts} testbed test prompts'}; {args.repeats} repeats (median), "
        f"calls over {args.slow_s} s timed once; "
        f"token buckets: powers of {args.base}; {time.perf_counter() - start:.0f} s in all."
    )
    text = report(rows, timing_rows, header)
    print(text)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_csv(out.with_suffix(".csv"), rows)
        write_csv(out.with_name(out.stem + "_timings.csv"), timing_rows)
        out.with_suffix(".md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
