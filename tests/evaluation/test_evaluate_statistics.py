"""The evaluation's statistics: dev/test split, paired bootstrap intervals, FD to AR, per-run model folders,
the interval matched rule and the ablation / headline presets (docs/evaluation.md)."""

import shutil

import numpy as np
import pytest
import torch
from mulo_sd.training.evaluate import run, run_entries
from omegaconf import OmegaConf
from scipy.stats import bootstrap

from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.evaluation.harness import evaluate
from mulo_sd.evaluation.matched_quality import matched_quality_table
from mulo_sd.evaluation.paired import Bootstrap
from mulo_sd.evaluation.runs import RunSpec, expand_runs
from mulo_sd.evaluation.summaries import add_ratios, summarize
from mulo_sd.evaluation.tables import ablation_groups
from mulo_sd.evaluation.texture import pattern, texture
from mulo_sd.nets.upsampler import Upsampler
from mulo_sd.pipeline.decode_entry import decode
from mulo_sd.pipeline.run_models import with_folders
from mulo_sd.pipeline.testbed_models import load_models
from mulo_sd.testbed.prompts import DEV_STREAM, TEST_STREAM, evaluation_prompts
from mulo_sd.testbed.synthscenes import render_scene
from tests.helpers import read_csv
from tests.training.test_decode_cli import at, compose, save_tiny_testbed


@pytest.fixture(scope="module")
def testbed(tmp_path_factory):
    return save_tiny_testbed(tmp_path_factory.mktemp("testbed"))


def test_dev_and_test_splits_are_fixed_disjoint_streams():
    dev, test = (
        evaluation_prompts(6, image_size=16, split="dev"),
        evaluation_prompts(6, image_size=16, split="test"),
    )
    assert [p.split for p in dev + test] == ["dev"] * 6 + ["test"] * 6
    assert [p.caption for p in dev] == [render_scene(DEV_STREAM, i, 16)[1] for i in range(6)]
    assert [p.caption for p in test] == [render_scene(TEST_STREAM, i, 16)[1] for i in range(6)]
    assert not any(torch.equal(a.image, b.image) for a in dev for b in test)  # no scene in both
    again = evaluation_prompts(3, image_size=16, split="test")  # a count names a prefix: fixed membership
    assert all(torch.equal(a.image, b.image) for a, b in zip(again, test, strict=False))
    legacy = evaluation_prompts(2, image_size=16)  # split "all": stream 3, as before the split existed
    assert [p.caption for p in legacy] == [p.caption for p in dev[:2]] and legacy[0].split == "all"
    with pytest.raises(ValueError, match=r"prompts.split must be one of \('dev', 'test', 'all'\)"):
        evaluation_prompts(2, split="val")
    with pytest.raises(ValueError, match=r"prompts.seed=5 picks the stream of split 'all' only"):
        evaluation_prompts(2, seed=5, split="test")


def hand_rows(label, walls, scores, seed=0, method="x"):
    return [
        {"family": label, "label": label, "method": method, "knobs": "{}", "prompt_index": i, "seed": seed,
         "wall_s": wall, "sequential_steps": 10, "target_forwards": 10, "drafter_forwards": 0,
         "tokens_drafted": 0, "tokens_accepted": 0, "sceneeval": score, "nll": 2.0 + score}
        for i, (wall, score) in enumerate(zip(walls, scores, strict=True))
    ]  # fmt: skip


def test_bootstrap_intervals_equal_scipy_on_the_per_prompt_numbers():
    rng = np.random.default_rng(7)
    ar_walls, x_walls = rng.uniform(1, 2, 12), rng.uniform(0.2, 0.6, 12)
    ar_scores, x_scores = rng.choice([0, 1 / 3, 2 / 3, 1], 12), rng.choice([0, 1 / 3, 2 / 3, 1], 12)
    rows = hand_rows("AR", ar_walls, ar_scores, method="ar") + hand_rows("X", x_walls, x_scores)
    add_ratios(rows, "AR")
    settings = Bootstrap(resamples=999, seed=3)
    _, x = summarize(rows, "AR", settings)

    def direct(values, statistic):
        result = bootstrap((values,), statistic, n_resamples=999, method="percentile",
                           rng=np.random.default_rng(3))  # fmt: skip
        return result.confidence_interval.low, result.confidence_interval.high

    d = x_scores - ar_scores
    assert x["d_sceneeval"] == pytest.approx(d.mean())
    assert (x["d_sceneeval_lo"], x["d_sceneeval_hi"]) == direct(d, np.mean)
    assert (x["d_nll_lo"], x["d_nll_hi"]) == direct((2 + x_scores) - (2 + ar_scores), np.mean)
    assert (x["speedup_lo"], x["speedup_hi"]) == direct(ar_walls / x_walls, np.median)
    assert x["speedup_lo"] <= x["speedup_median"] <= x["speedup_hi"]
    # two seeds with equal numbers per prompt: the prompt is resampled with both seeds, so the interval is the
    # one-seed interval (treating the 24 decodes as independent would narrow it)
    twice = rows + [row | {"seed": 1} for row in rows]
    add_ratios(twice, "AR")
    _, x2 = summarize(twice, "AR", settings)
    assert x2["d_sceneeval_lo"] == pytest.approx(x["d_sceneeval_lo"], abs=1e-12)
    assert x2["d_sceneeval_hi"] == pytest.approx(x["d_sceneeval_hi"], abs=1e-12)
    assert x2["images"] == 24


def test_interval_rule_picks_the_fastest_run_whose_interval_contains_zero():
    def entry(family, label, speedup, low, high):
        return {"split": "all", "family": family, "label": label,
                "method": "ar" if family == "AR" else "mulo",
                "speedup_median": speedup, "speedup_of_medians": speedup, "step_ratio_median": speedup,
                "sceneeval": 0.5, "d_sceneeval": (low + high) / 2, "d_sceneeval_lo": low,
                "d_sceneeval_hi": high}  # fmt: skip

    summary = [
        entry("AR", "AR", 1.0, 0.0, 0.0),
        entry("M", "M tau=0.2", 6.0, -0.09, -0.01),  # fastest, but its interval lies below 0
        entry("M", "M tau=0.05", 4.0, -0.05, 0.01),
        entry("M", "M tau=0.01", 3.0, -0.02, 0.03),
    ]
    table = matched_quality_table(summary, "ar")
    picked = [(row["method"], row["setting"], row["speedup"]) for row in table]
    assert picked == [("AR", "-", 1.0), ("M", "tau=0.05", 4.0)]
    with pytest.raises(ValueError, match=r"tolerance 0.03 applies to rule 'tolerance' only"):
        matched_quality_table(summary, "ar", tolerance=0.03)
    with pytest.raises(
        ValueError, match=r"needs 'd_sceneeval_lo' and 'd_sceneeval_hi' in every .* at least 2 prompts"
    ):
        matched_quality_table([summary[0], {**summary[1], "d_sceneeval_lo": None}], "ar")


def test_fd_to_ar_of_ar_against_itself_is_zero_and_positive_under_other_seeds(testbed, tmp_path):
    models = load_models(testbed, names=["vq", "target", "sceneeval"])
    prompts = evaluation_prompts(4, image_size=16, split="test")
    runs = [RunSpec("ar"), RunSpec("zipar", {"window": 2})]
    same = evaluate(models, runs, prompts, [0], SamplerConfig(), "cpu", tmp_path / "same", warmup=0,
                    grid_prompts=0, progress=False, fd_ar_seeds=[0], fd_min_images=0)  # fmt: skip
    assert same.summary[0]["fd_ar"] == pytest.approx(0.0, abs=1e-6)  # AR's decodes repeat exactly
    assert same.summary[1]["fd_ar"] > 1e-4
    ar, zipar = same.summary
    assert (ar["fd_ratio"], ar["fd_ratio_lo"], ar["fd_ratio_hi"]) == (1.0, 1.0, 1.0)
    assert zipar["fd_ratio"] == pytest.approx(zipar["fd"] / ar["fd"])
    assert 0 < zipar["fd_ratio_lo"] < zipar["fd_ratio_hi"]
    shown = f"{zipar['fd_ratio']:.4g} [{zipar['fd_ratio_lo']:.4g}, {zipar['fd_ratio_hi']:.4g}]"
    assert shown in (tmp_path / "same/summary.md").read_text()
    other = evaluate(models, runs, prompts, [0], SamplerConfig(), "cpu", tmp_path / "other", warmup=0,
                     grid_prompts=0, progress=False, fd_ar_seeds=[1, 2])  # fmt: skip
    floor = other.summary[0]["fd_ar"]
    assert floor > 1e-4  # AR under seeds {0} against AR under seeds {1, 2}
    references = {entry["label"]: entry for entry in other.references}
    assert references["AR (other seeds)"]["images"] == 8 and references["AR (other seeds)"]["fd_ar"] == floor
    assert [row["split"] for row in other.rows] == ["test"] * 8
    with pytest.raises(ValueError, match=r"fd_ar_seeds needs quality=True and the sceneeval model"):
        evaluate(models, runs, prompts, [0], SamplerConfig(), "cpu", tmp_path, quality=False, fd_ar_seeds=[1])


def test_texture_columns_equal_a_hand_computation_on_the_decoded_images(testbed, tmp_path):
    models = load_models(testbed, names=["vq", "target", "sceneeval"])
    prompts, seeds = evaluation_prompts(3, image_size=16, split="test"), [0, 1]
    runs, settings = [RunSpec("ar"), RunSpec("zipar", {"window": 2})], Bootstrap(resamples=199, seed=4)
    result = evaluate(models, runs, prompts, seeds, SamplerConfig(), "cpu", tmp_path, warmup=0,
                      grid_prompts=0, progress=False, fd_ar_seeds=[2], bootstrap=settings)  # fmt: skip

    def hand(run, prompt, seed):  # decodes repeat exactly: the image the harness scored
        return decode(run.method, models, [prompt.caption], run.knobs, SamplerConfig(), seed).image

    images, vq = torch.stack([p.image for p in prompts]), models.require("vq")
    round_trip = vq.decode(vq.encode(images)).clamp(-1, 1)
    decoded = {(r.label, p.index, s): hand(r, p, s) for r in runs for p in prompts for s in seeds}
    text = (tmp_path / "summary.md").read_text()
    for name, statistic in (("texture", texture), ("pattern", pattern)):
        values = {key: float(statistic(image)[0]) for key, image in decoded.items()}
        assert {(row["label"], row["prompt_index"], row["seed"]): row[name] for row in result.rows} == values
        real = sum(statistic(images).tolist()) / len(images)  # summed as the harness sums
        ar, zipar = result.summary
        for entry in (ar, zipar):  # rows in decoding order: prompt by prompt, seeds within
            own = [values[entry["label"], p.index, s] for p in prompts for s in seeds]
            assert entry[name] == sum(own) / len(own) and entry[f"{name}_gap"] == entry[name] - real
        paired = (f"{name}_ratio", f"d_{name}", f"d_{name}_lo", f"d_{name}_hi")
        assert [ar[column] for column in paired] == [1.0, 0.0, 0.0, 0.0]
        assert zipar[f"{name}_ratio"] == zipar[name] / ar[name]
        d = np.array(
            [
                [values["zipar window=2", p.index, s] - values["ar", p.index, s] for p in prompts]
                for s in seeds
            ]
        )
        assert zipar[f"d_{name}"] == float(d.reshape(-1).mean())  # per_seed_samples: seed by seed
        direct = bootstrap(
            (d.mean(0),), np.mean, n_resamples=199, method="percentile", rng=np.random.default_rng(4)
        )
        assert zipar[f"d_{name}_lo"] == pytest.approx(direct.confidence_interval.low, abs=1e-12)
        assert zipar[f"d_{name}_hi"] == pytest.approx(direct.confidence_interval.high, abs=1e-12)
        references = {entry["label"]: entry[name] for entry in result.references}
        other = [float(statistic(hand(runs[0], p, 2))[0]) for p in prompts]
        assert references == {
            "real images": real,
            "tokenizer round trip": sum(statistic(round_trip).tolist()) / len(images),
            "AR (other seeds)": sum(other) / len(other),
        }
        shown = f"{zipar[f'd_{name}']:.4g} [{zipar[f'd_{name}_lo']:.4g}, {zipar[f'd_{name}_hi']:.4g}]"
        assert shown in text
        assert float(read_csv(tmp_path / "summary.csv")[1][f"{name}_gap"]) == zipar[f"{name}_gap"]
    assert text.count("| texture | texture_ratio | d_texture | texture_gap | pattern | pattern_ratio |") == 2
    assert [row["background"] for row in result.rows[: len(seeds) * 3 : len(seeds)]] == [
        p.attributes["background"]["kind"] for p in prompts
    ]
    assert "## Pattern by background kind (test prompts)" in text
    assert 0 < zipar["pattern"] < zipar["texture"]  # the strongest frequencies carry part of the detail
    quick = evaluate(models, runs[:1], prompts[:1], [0], SamplerConfig(), "cpu", tmp_path / "q", warmup=0,
                     quality=False, grid_prompts=0, progress=False)  # fmt: skip
    assert not {"texture", "pattern"} & (set(quick.rows[0]) | set(quick.summary[0]))


def test_cli_refuses_fd_ar_seeds_shared_with_the_seeds(testbed, tmp_path):
    cfg = compose("evaluate", tmp_path, ["eval=smoke", *at(testbed), "fd_ar.seeds=[0,5]"])
    with pytest.raises(ValueError, match=r"fd_ar.seeds \[0, 5\] share \[0\] with seeds \[0\]"):
        run(cfg)


def perturbed_copy(source, folder, scale):
    """A copy of the sampler folder `source` in `folder`, its weights moved by `scale` * noise."""
    sampler = Upsampler.from_pretrained(source)
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in sampler.parameters():
            parameter.add_(scale * torch.randn_like(parameter))
    sampler.save_pretrained(folder)
    return folder


def test_run_folders_swap_the_model_and_name_the_run_when_missing(testbed, tmp_path):
    models = load_models(testbed, names=["vq", "target", "drafter_r2", "upsampler_r2", "downsampler_r2"])
    perturbed_copy(testbed / "upsampler_r2", tmp_path / "other_up", 2.0)
    swapped = with_folders(models, {"upsampler_r2": str(tmp_path / "other_up")}, "mine")
    assert swapped.get("upsampler_r2") is not models.get("upsampler_r2")
    assert swapped.get("drafter_r2") is models.get("drafter_r2") and swapped.target is models.target
    knobs, caption = {"r": 2, "tau": 0.3, "k": 0}, [evaluation_prompts(1, image_size=16)[0].caption]
    base = decode("mulo", models, caption, knobs, SamplerConfig(), 0)
    other = decode("mulo", swapped, caption, knobs, SamplerConfig(), 0)
    assert not torch.equal(base.tokens, other.tokens)
    again = decode("mulo", models, caption, knobs, SamplerConfig(), 0)  # the base models are untouched
    assert torch.equal(base.tokens, again.tokens)
    relative = RunSpec("mulo", knobs, label="rel", folders={"upsampler_r2": "no_such_folder"})
    prompts = evaluation_prompts(1, image_size=16)
    with pytest.raises(
        FileNotFoundError, match=r"run 'rel': folders.upsampler_r2: no model in .*no_such_folder"
    ):
        evaluate(models, [RunSpec("ar"), relative], prompts, [0], SamplerConfig(), "cpu", tmp_path)
    with pytest.raises(ValueError, match=r"run 'px': folders.upsampler_r2: the run does not decode with a"):
        RunSpec("mulo", {**knobs, "upsampler": "pixel"}, label="px", folders={"upsampler_r2": "x"})
    lost = {
        "label": "lost",
        "method": "mulo",
        "knobs": {"r": 2},
        "folders": {"upsampler_r2": "${testbed:nothing}"},
    }
    cfg = OmegaConf.create({"runs": [{"method": "ar"}, lost]})
    with pytest.raises(ValueError, match=r"run entry runs\[1\] \('lost'\): .*no packaged testbed model"):
        run_entries(cfg)


ABLATION_LABELS = [
    "AR", "base: token_ce, k=4, l=0, parallel", "up-sampler=pixel", "up-sampler=mse_lpips",
    "up-sampler=mse_lpips_gan", "up-sampler=target_kl", "up-sampler=bicubic_distilled",
    "up-sampler=latent_distilled", "pooling k=0", "pooling k=16", "rejection=raster", "rejection=local l=1",
    "parallel=false", "accept_rule=typical",
]  # fmt: skip


def test_ablations_preset_expands_into_the_five_ablations(testbed, tmp_path):
    cfg = compose("evaluate", tmp_path, ["eval=ablations", *at(testbed)])
    runs = expand_runs(OmegaConf.to_container(cfg.runs))  # unresolved: the sampler folders may not exist yet
    assert [run.label for run in runs] == ABLATION_LABELS
    base = ABLATION_LABELS[1]
    assert ablation_groups(runs) == {
        "up-sampler": [base, *ABLATION_LABELS[2:8]],
        "pooling": [base, "pooling k=0", "pooling k=16"],
        "rejection": [base, "rejection=raster", "rejection=local l=1"],
        "parallel decoding": [base, "parallel=false"],
        "accept rule": [base, "accept_rule=typical"],
    }
    folders = [run.folders.get("upsampler_r2") for run in runs[3:8]]
    losses = ("mse_lpips", "mse_lpips_gan", "target_kl", "bicubic_distilled", "latent_distilled")
    assert folders == [f"${{testbed:ablation/upsampler_r2_{loss}}}" for loss in losses]
    assert cfg.prompts.split == "test" and runs[2].knobs["upsampler"] == "pixel"


def test_ablations_preset_runs_end_to_end_with_stand_in_samplers(testbed, tmp_path):
    overrides = ["eval=ablations", *at(testbed), "prompts.count=2", "seeds=[0]", "fd_ar.seeds=[1]",
                 "warmup=0", "bootstrap.resamples=199", "progress=false"]  # fmt: skip
    cfg = compose("evaluate", tmp_path, overrides)
    for entry in cfg.runs:  # the committed sampler under the names the lead commits
        if entry.get("folders"):
            name = entry.label.split("=")[1]
            entry.folders.upsampler_r2 = str(shutil.copytree(testbed / "upsampler_r2", tmp_path / name))
    result = run(cfg)
    out = tmp_path / "run"
    text = (out / "summary.md").read_text()
    assert "## Ablations (test prompts)" in text and text.count("\n### ") == 5
    assert (out / "ablations.png").is_file()
    summary = read_csv(out / "summary.csv")
    assert [row["label"] for row in summary] == ABLATION_LABELS
    # a stand-in that is the committed sampler decodes exactly like the base
    by_label = {row["label"]: row for row in result.evaluation.rows if row["seed"] == 0}
    assert by_label["up-sampler=mse_lpips"]["nll"] == by_label[ABLATION_LABELS[1]]["nll"]


def test_matched_table_picks_on_dev_and_reports_on_test(testbed, tmp_path):
    overrides = ["eval=smoke", *at(testbed), "prompts.split=test", "+matched.dev_prompts=2", "warmup=0",
                 "bootstrap.resamples=199", "progress=false", "grid_prompts=1"]  # fmt: skip
    result = run(compose("evaluate", tmp_path, overrides))
    summary = result.evaluation.summary
    assert [entry["split"] for entry in summary] == ["dev"] * 5 + ["test"] * 5
    dev = {entry["label"]: entry for entry in summary[:5]}
    test = {entry["label"]: entry for entry in summary[5:]}
    for row in result.matched:
        if row["setting"] is None:
            continue
        label = row["method"] if row["setting"] == "-" else f"{row['method']} {row['setting']}"
        assert (
            row["sceneeval_dev"] == dev[label]["sceneeval"] and row["sceneeval"] == test[label]["sceneeval"]
        )
        assert row["speedup"] == test[label]["speedup_median"]
    assert (
        "chosen on the 2 dev prompts, reported on the test prompts"
        in (tmp_path / "run" / "matched.md").read_text()
    )
    rows = result.evaluation.rows
    assert {(row["split"], row["prompt"]) for row in rows} == {
        *(("dev", render_scene(DEV_STREAM, i, 16)[1]) for i in range(2)),
        *(("test", render_scene(TEST_STREAM, i, 16)[1]) for i in range(2)),
    }
    with pytest.raises(
        ValueError, match=r"matched.dev_prompts picks each setting on dev prompts .* prompts.split=test"
    ):
        run(compose("evaluate", tmp_path / "b", ["eval=smoke", *at(testbed), "+matched.dev_prompts=2"]))


def test_headline_preset_expands_to_the_readme_settings(testbed, tmp_path):
    cfg = compose("evaluate", tmp_path, ["eval=headline", *at(testbed)])
    runs = expand_runs(OmegaConf.to_container(cfg.runs, resolve=True))
    assert [run.method for run in runs] == ["ar", "zipar", *["mulo"] * 14]
    assert [run.knobs.get("r") for run in runs[2:]] == [2] * 7 + [4] * 7 and cfg.prompts.split == "test"
    upsamplers = [run.knobs.get("upsampler", "latent") for run in runs[2:]]
    pixel = [i for i, upsampler in enumerate(upsamplers, start=2) if upsampler == "pixel"]
    assert pixel == [5, 6, 12, 14] and set(upsamplers) == {"latent", "pixel"}
    distilled = [runs[i].folders.get(f"upsampler_r{runs[i].knobs['r']}", "") for i in (3, 4, 7, 10, 11, 13)]
    for folder, name in zip(distilled, ("r2", "r2", "r2", "r4", "r4", "r4"), strict=True):
        assert f"ablation/upsampler_{name}_bicubic_distilled" in folder
    assert [folder.endswith("_noncausal") for folder in distilled] == [False, True, True, False, True, True]
    for i, r in ((8, 2), (15, 4)):
        assert runs[i].folders[f"upsampler_r{r}"].endswith(f"ablation/upsampler_r{r}_latent_distilled")
    drafters = [run.folders.get(f"drafter_r{run.knobs.get('r')}", "") for run in runs]
    from_target = [i for i, folder in enumerate(drafters) if folder.endswith("_from_target")]
    assert from_target == [6, 7, 8, 13, 14, 15]
    assert all(f"ablation/drafter_r{runs[i].knobs['r']}_from_target" in drafters[i] for i in from_target)
    # at the settings chosen for the committed drafters: the pixel and the not-row-causal rows'
    for fine_tuned, committed in ((6, 5), (7, 4), (13, 11), (14, 12)):
        assert runs[fine_tuned].knobs == runs[committed].knobs
    # the latent-distilled rows at the taus chosen for them on dev: 0.02 at 2x, 0.05 at 4x
    assert runs[8].knobs == runs[7].knobs and runs[15].knobs == {**runs[13].knobs, "tau": 0.05}
    assert [run.knobs["l"] for run in runs[9:]] == [1] * 7
    assert list(cfg.fd_ar.seeds) and not set(cfg.fd_ar.seeds) & set(cfg.seeds)
