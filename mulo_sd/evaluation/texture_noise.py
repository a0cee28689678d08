"""The noise of the texture statistics (mulo_sd/evaluation/texture.py: `texture` and `pattern`): AR against AR
under other seeds, on the testbed's test prompts, paired per prompt as the harness pairs a run with AR
(docs/statistics.md section 6).

    python -m mulo_sd.evaluation.texture_noise --prompts 24 64 --seeds 0 1 2 3 --threads 1

AR decodes the first max(--prompts) test prompts once per seed (batch 1, the harness's decode, so seed s
gives the image a `mulo-eval` AR run decodes at seed s). Per prompt count (a prefix of those prompts) it
prints the real scenes' and AR's mean `texture`, `pattern` and octave profile, then, per statistic s, one
row per comparison of two disjoint seed sets of AR, paired position by position (seeds (0,) against (1,);
(0, 1) against (2, 3), the shape of the headline run, conf/eval/headline.yaml): `s_ratio`, `d_s` with its
bootstrap interval (mulo_sd/evaluation/paired.py) and whether that interval excludes 0, which it should
about 5% of the time for two draws of one method. The comparisons share seeds, so they are not
independent; `seed_effect` tests for what would make the intervals too narrow, a seed that shifts every
prompt's statistic at once.
`--csv` also writes every (prompt, seed)'s statistics.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.evaluation.paired import BOOTSTRAP, Bootstrap, interval, per_seed_samples
from mulo_sd.evaluation.tables import markdown_table
from mulo_sd.evaluation.texture import OCTAVES, SCORES, band_shares, image_scores, mean_scores
from mulo_sd.evaluation.writers import write_csv
from mulo_sd.pipeline.decode_entry import decode
from mulo_sd.pipeline.model_set import TESTBED_DIR
from mulo_sd.pipeline.testbed_models import image_size, load_models
from mulo_sd.testbed.prompts import evaluation_prompts

TESTBED_CFG_SCALE = 2.0  # the testbed set's sampling default (conf/models/folder.yaml, `sampler`)
BANDS = ("<= 1/64", "1/64-1/32", "1/32-1/16", "1/16-1/8", "1/8-1/4", "> 1/4")  # OCTAVES' bands, cycles/px


def comparison_columns(name: str) -> tuple[str, ...]:
    """The columns of a comparison row of statistic `name` (`compare`)."""
    return ("reference seeds", "run seeds", f"{name}_ratio", f"d_{name}", f"d_{name}_lo", f"d_{name}_hi",
            "excludes 0")  # fmt: skip


def decode_ar(models, prompts, seeds: list[int], sampler: SamplerConfig, progress: bool = True) -> dict:
    """{(prompt index, seed): AR's image [3, H, W]} for every prompt and seed."""
    images = {}
    with tqdm(total=len(prompts) * len(seeds), unit="decode", disable=not progress, file=sys.stderr) as bar:
        for prompt in prompts:
            for seed in seeds:
                result = decode("ar", models, [prompt.caption], {}, sampler, seed)
                images[prompt.index, seed] = result.image[0]
                bar.update()
    return images


def comparisons(seeds: list[int]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(reference seeds, run seeds): every pair of single seeds, then every split of the seeds into two
    halves of equal size >= 2 (each split once: the reference half holds the first seed)."""
    pairs = [((a,), (b,)) for a, b in itertools.combinations(seeds, 2)]
    half = len(seeds) // 2
    if half < 2 or len(seeds) % 2:
        return pairs
    splits = [
        (first, tuple(s for s in seeds if s not in first)) for first in itertools.combinations(seeds, half)
    ]
    return pairs + [(first, rest) for first, rest in splits if seeds[0] in first]


def compare(
    values: dict, indices: list[int], reference: tuple, run: tuple, settings: Bootstrap, name: str = "texture"
) -> dict:
    """One comparison row of statistic `name` (values: {(prompt index, seed): its value}): run seeds against
    reference seeds, paired position by position on each prompt."""
    rows = [
        {"prompt_index": i, "seed": n, f"d_{name}": values[i, b] - values[i, a]}
        for i in indices
        for n, (a, b) in enumerate(zip(reference, run, strict=True))
    ]
    samples = per_seed_samples(rows, f"d_{name}")
    low, high = interval(samples, np.mean, settings)
    mean = {seeds: np.mean([values[i, s] for i in indices for s in seeds]) for seeds in (reference, run)}
    return {
        "reference seeds": " ".join(map(str, reference)), "run seeds": " ".join(map(str, run)),
        f"{name}_ratio": float(mean[run] / mean[reference]),
        f"d_{name}": float(np.concatenate(samples).mean()), f"d_{name}_lo": low, f"d_{name}_hi": high,
        "excludes 0": "yes" if low is not None and not low <= 0 <= high else "no",
    }  # fmt: skip


def noise_report(
    prompts, images: dict, values: dict, counts: list[int], seeds: list[int], settings: Bootstrap
) -> str:
    """The markdown report of the module docstring; images: {(prompt index, seed): image}, values:
    {statistic of SCORES: {(prompt index, seed): its value}}."""
    sections = []
    for count in counts:
        indices = [p.index for p in prompts[:count]]
        means = [
            band_means("real scenes", torch.stack([p.image for p in prompts[:count]])),
            band_means(f"AR, seeds {' '.join(map(str, seeds))}", torch.stack(
                [images[i, s] for i in indices for s in seeds]
            )),
        ]  # fmt: skip
        sections.append(
            f"## {count} test prompts\n\nMean texture, pattern and mean power share per band (cycles per "
            f"pixel):\n\n{markdown_table(means, ('images', 'count', *SCORES, *BANDS))}"
        )
        sections += [_comparisons_section(values[name], indices, seeds, settings, name) for name in SCORES]
    return "\n\n".join(sections)


def _comparisons_section(values: dict, indices: list[int], seeds: list[int], settings: Bootstrap, name: str):
    rows = [compare(values, indices, a, b, settings, name) for a, b in comparisons(seeds)]
    excluded = sum(row["excludes 0"] == "yes" for row in rows)
    f, p = seed_effect(values, indices, seeds, settings)
    return (
        f"### {name}\n\nAR against AR, paired per prompt (d_{name}_lo .. d_{name}_hi: the "
        f"{settings.confidence:.0%} percentile-bootstrap interval, prompts resampled with their seeds):\n\n"
        f"{markdown_table(rows, comparison_columns(name))}\n\nThe interval excludes 0 in {excluded} of "
        f"{len(rows)} comparisons. Seed effect common to the prompts: F = {f:.3g}, permutation p = {p:.3g} "
        f"({settings.resamples} permutations of the seeds within each prompt)."
    )


def seed_effect(
    values: dict, indices: list[int], seeds: list[int], settings: Bootstrap
) -> tuple[float, float]:
    """The seed main effect of the prompts x seeds table of `values`: (F, p). F = the seeds' mean square
    over the residual mean square of the two-way layout without replication; p = the share of
    `settings.resamples` tables, the seeds permuted within each prompt (exchangeable when the seed has no
    effect common to the prompts), whose F is at least as large (the observed table counted once)."""
    table = np.array([[values[i, s] for s in seeds] for i in indices])
    rng = np.random.default_rng(settings.seed)
    draws = rng.permuted(np.broadcast_to(table, (settings.resamples, *table.shape)), axis=2)
    tables = np.concatenate([table[None], draws])
    seed_means = tables.mean(1, keepdims=True)
    residual = tables - tables.mean(2, keepdims=True) - seed_means + tables.mean((1, 2), keepdims=True)
    between = len(indices) * ((seed_means - tables.mean((1, 2), keepdims=True)) ** 2).sum((1, 2))
    f = (between / (len(seeds) - 1)) / ((residual**2).sum((1, 2)) / ((len(indices) - 1) * (len(seeds) - 1)))
    return float(f[0]), float((f >= f[0]).mean())


def band_means(label: str, images: torch.Tensor) -> dict:
    """Mean texture, pattern and octave profile (band_shares over OCTAVES) of images [B, 3, H, W]."""
    profile = band_shares(images, OCTAVES).mean(0).tolist()
    bands = dict(zip(BANDS, profile, strict=True))
    return {"images": label, "count": len(images), **mean_scores(images)} | bands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mulo_sd.evaluation.texture_noise", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--prompts", type=int, nargs="+", default=[24, 64], help="prompt counts (prefixes)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3], help="AR's seeds")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--testbed", default=str(TESTBED_DIR), help="the testbed model folder")
    parser.add_argument("--cfg-scale", type=float, default=TESTBED_CFG_SCALE, help="guidance scale")
    parser.add_argument("--resamples", type=int, default=BOOTSTRAP.resamples, help="bootstrap draws")
    parser.add_argument("--csv", help="also write every (prompt, seed)'s texture to this CSV file")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if len(set(args.seeds)) != len(args.seeds) or len(args.seeds) < 2 or min(args.prompts) < 1:
        raise SystemExit(f"need >= 2 distinct seeds and prompt counts >= 1, got {args.seeds}, {args.prompts}")
    if args.threads:
        torch.set_num_threads(args.threads)
    models = load_models(args.testbed, names=["vq", "target"])
    prompts = evaluation_prompts(max(args.prompts), image_size=image_size(models), split="test")
    sampler = SamplerConfig(cfg_scale=args.cfg_scale)
    images = decode_ar(models, prompts, args.seeds, sampler, progress=not args.no_progress)
    scores = dict(zip(images, image_scores(torch.stack(list(images.values()))), strict=True))
    values = {name: {key: row[name] for key, row in scores.items()} for name in SCORES}
    if args.csv:
        write_csv(Path(args.csv), [{"prompt_index": i, "seed": s, **row} for (i, s), row in scores.items()])
    print(f"# Texture and pattern noise: AR against AR\n\nsampler {sampler}\n")
    settings = Bootstrap(resamples=args.resamples)
    print(noise_report(prompts, images, values, sorted(args.prompts), args.seeds, settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
