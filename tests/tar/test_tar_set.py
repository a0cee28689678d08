"""Tar text-to-image as a model set: official-layout AR-DTok files -> `mulo-convert` -> `mulo-decode
models=tar_512 / tar_1024` in two stages (the MLLM's TA-Tok features, then a method on the AR-DTok GPTs),
the set's mismatches refused before any weights are read, and samplers validated under the AR-DTok target
with TA-Tok features stored in the shards."""

from __future__ import annotations

import io
import json
import sys
import types

import numpy as np
import pytest
import torch
from mulo_sd.data.shards import write_shards
from mulo_sd.training.caption_condition import CaptionCondition
from mulo_sd.training.decode import run
from mulo_sd.training.train import run as train_run
from PIL import Image

from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.llamagen.convert import main as convert
from mulo_sd.nets import io as model_io
from mulo_sd.nets.gpt import GPT
from mulo_sd.pipeline import mulo_pipeline
from mulo_sd.pipeline.model_set import ModelSet, load_model_set
from mulo_sd.pipeline.tar_decode import decode_tar
from mulo_sd.testbed.synthscenes import render_scene
from tests.helpers import compose_train_config
from tests.official_fixtures import CAPTION_DIM, GPT_HEADS, write_tar_ar_dtok
from tests.tar_fixtures import (
    TAR_FOLDERS,
    TAR_GRIDS,
    TATOK_TOKENS,
    tar_overrides,
    write_tar_set,
    write_tatok_file,
)
from tests.training.test_decode_cli import compose

PROMPT = "prompt='a photo of a macaw'"
METHODS = {"ar": [], "zipar": ["knobs.window=2"], "lantern": ["knobs.k=8"], "mulo": ["knobs.tau=0.05"]}
GREEDY = SamplerConfig(temperature=0.0, cfg_scale=4.0)
EXACT = {"rejection": "raster", "k": 0, "tau": 1.0}  # docs/algorithm.md: MuLo-SD that keeps AR's tokens


@pytest.fixture(scope="module")
def tar_root(tmp_path_factory):
    return write_tar_set(tmp_path_factory.mktemp("tar_ckpts"))


def forbid_weights(monkeypatch) -> None:
    """From here on, reading any weights or decoding fails the test: errors must come from the configs."""

    def fail(*args, **kwargs):
        raise AssertionError("weights were read or a decode ran before the set was checked")

    monkeypatch.setattr(model_io, "read_weights", fail)
    monkeypatch.setattr(mulo_pipeline, "decode_tar", fail)
    monkeypatch.setattr(torch, "load", fail)
    monkeypatch.setitem(sys.modules, "mulo_sd.tar.mllm", types.ModuleType("no_mllm"))  # loading it fails


def tar_set(root) -> ModelSet:
    """The tiny tar_512 set on the CPU in float32."""
    return ModelSet.from_config(
        {"name": "tar_512", "family": "tar", "root": str(root), "folders": TAR_FOLDERS["tar_512"]}
    )


def test_convert_reads_the_prefix_length_and_grid_from_the_ar_dtok_file(tmp_path, capsys):
    source = tmp_path / "ar_dtok_lp_64px.pth"
    write_tar_ar_dtok(source, grid=4, cls_token_num=9)
    assert convert(["tar-ar-dtok", str(source), str(tmp_path / "out"), "--n-head", str(GPT_HEADS)]) == 0
    printed = capsys.readouterr().out
    assert "cond_len = 9  (checkpoint args.cls_token_num)" in printed
    assert "grid_size = (4, 4)  (checkpoint args.max_seq_len)" in printed
    config = GPT.load_config(tmp_path / "out")
    assert (config.cond_len, config.grid_size, config.n_positions) == (9, (4, 4), 24)
    with pytest.raises(SystemExit, match=r"--cls-token-num 5 disagrees with the file's own training setting"):
        convert(["tar-ar-dtok", str(source), str(tmp_path / "o2"), "--n-head", "4", "--cls-token-num", "5"])


@pytest.mark.parametrize("method", list(METHODS))
def test_each_method_decodes_a_prompt_in_two_stages(tar_root, tmp_path, method):
    out = tmp_path / "sample.png"
    overrides = tar_overrides(tar_root, "tar_512", f"method={method}", PROMPT, f"out={out}", *METHODS[method])
    stats = run(compose("decode", tmp_path, overrides))
    target_grid = TAR_GRIDS["tar_512"]["target"]
    assert Image.open(out).size == (16 * target_grid,) * 2
    tokens = target_grid**2
    assert stats["mllm/batch_size"] == stats["ar_dtok/batch_size"] == 1
    assert stats["mllm/target_forwards"] >= TATOK_TOKENS  # one MLLM call per TA-Tok token at least
    assert stats["end_to_end_wall_s"] == pytest.approx(stats["mllm/wall_s"] + stats["ar_dtok/wall_s"])
    if method in ("ar", "zipar"):  # 4x4 grid: 16 calls, ZipAR's w + (h - 1) * W = 4 + 3 * 2
        assert stats["ar_dtok/target_forwards"] == {"ar": tokens, "zipar": 10}[method]
    else:
        assert stats["ar_dtok/tokens_accepted"] + stats["ar_dtok/tokens_resampled"] == tokens
        assert stats["ar_dtok/drafter_forwards"] >= 1
    assert "ar_dtok/speedup" not in stats  # only with compare_ar=true


def test_tar_1024_runs_mulo_4x_by_default_and_reports_the_stage_speedups(tar_root, tmp_path):
    overrides = tar_overrides(tar_root, "tar_1024", "method=mulo", PROMPT, f"out={tmp_path / 'a.png'}",
                              "compare_ar=true")  # fmt: skip
    stats = run(compose("decode", tmp_path, overrides))
    assert stats["ar_dtok/upsampler_calls"] == stats["ar_dtok/cycles"] >= 1  # the r=4 drafter and samplers
    assert stats["ar_dtok/speedup"] == pytest.approx(stats["ar_dtok/ar_wall_s"] / stats["ar_dtok/wall_s"])
    first = stats["mllm/wall_s"]
    end_to_end = (first + stats["ar_dtok/ar_wall_s"]) / (first + stats["ar_dtok/wall_s"])
    assert stats["end_to_end/speedup"] == pytest.approx(end_to_end)


def test_the_sets_bring_tars_sampling_defaults_bf16_and_cuda(tar_root, tmp_path, monkeypatch):
    seen = {}

    def record(*args):
        seen["args"] = args
        raise Stopped

    monkeypatch.setattr(mulo_pipeline, "load_model_set", record)
    cfg = compose("decode", tmp_path, ["models=tar_1024", f"models.root={tar_root}", "method=mulo", PROMPT])
    assert dict(cfg.sampler) == {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "cfg_scale": 4.0}
    assert dict(cfg.models.mllm_sampler) == {
        "temperature": 1.0,
        "top_k": 1200,
        "top_p": 0.95,
        "cfg_scale": 1.0,
    }
    with pytest.raises(Stopped):
        run(cfg)
    model_set, names, device = seen["args"]
    assert device == "cuda" and model_set.dtype == "bfloat16" and model_set.family == "tar"
    assert names == ["vq", "target", "drafter_r4", "upsampler_r4", "mllm", "tatok"]  # one cycle: no D_r


class Stopped(Exception):
    pass


def test_greedy_mulo_with_exact_acceptance_equals_greedy_ar_on_the_ar_dtok_stage(tar_root, monkeypatch):
    models = load_model_set(tar_set(tar_root), device="cpu")
    prompts = ["a photo of a macaw", "a red bus"]
    mllm = SamplerConfig(temperature=0.0)
    reference = decode_tar("ar", models, prompts, {}, GREEDY, mllm, seed=0)
    seen = {"target": [], "drafter_r2": []}  # the condition each GPT's decode starts from
    for role, gpt in (("target", models.target), ("drafter_r2", models.drafters["drafter_r2"])):

        def start(cond, *args, _start=gpt.start, _seen=seen[role], **kwargs):
            _seen.append(cond.clone())
            return _start(cond, *args, **kwargs)

        monkeypatch.setattr(gpt, "start", start)
    exact = decode_tar("mulo", models, prompts, EXACT, GREEDY, mllm, seed=1)
    assert torch.equal(exact.features, reference.features)  # greedy stage 1: the same features
    assert torch.equal(exact.result.tokens, reference.result.tokens)
    assert exact.result.stats.tokens_drafted >= TAR_GRIDS["tar_512"]["target"] ** 2
    features = torch.cat(seen["target"])  # (one image at a time or all at once)
    assert torch.equal(features, reference.features) and torch.equal(torch.cat(seen["drafter_r2"]), features)


def test_the_features_condition_the_ar_dtok_and_zero_features_are_its_unconditional_branch(tar_root):
    models = load_model_set(tar_set(tar_root), device="cpu")
    target, features = (
        models.target,
        decode_tar("ar", models, ["a red bus"], {}, GREEDY, SamplerConfig(temperature=0.0), seed=0).features,
    )
    tokens = torch.zeros(1, 1, dtype=torch.long)
    with torch.no_grad():
        c, u = (target(tokens, features, drop=torch.tensor([drop]))[0, 0] for drop in (False, True))
        zero = target(tokens, torch.zeros_like(features), drop=torch.tensor([False]))[0, 0]
    torch.testing.assert_close(u, zero)  # Tar's null condition: all-zero TA-Tok features
    assert not torch.allclose(c, u)


def test_a_mllm_folder_of_another_model_is_an_error_before_any_weights(tar_root, tmp_path, monkeypatch):
    other = tmp_path / "t5"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "t5", "d_model": 16}))
    forbid_weights(monkeypatch)
    overrides = tar_overrides(tar_root, "tar_512", PROMPT, f"models.folders.mllm={other}")
    with pytest.raises(
        ValueError, match=r"t5/config.json: model_type is 't5', but Tar's MLLM is a Qwen2-family"
    ):
        run(compose("decode", tmp_path, overrides))


def test_a_gpt_of_another_family_in_a_tar_set_is_an_error_before_any_weights(tar_root, tmp_path, monkeypatch):
    from tests.llamagen_fixtures import write_llamagen_set

    llamagen = write_llamagen_set(tmp_path / "llamagen", samplers=False)
    forbid_weights(monkeypatch)
    overrides = tar_overrides(
        tar_root,
        "tar_512",
        PROMPT,
        "method=mulo",
        f"models.folders.drafter_r2={llamagen / 't2i_XL_stage1_256'}",
    )
    with pytest.raises(
        ValueError, match=r"drafter_r2 \(.*config.json\) has cond_type 't5', but a Tar set's GPTs"
    ):
        run(compose("decode", tmp_path, overrides))


def test_tatok_features_of_another_width_are_an_error_before_any_weights(tar_root, tmp_path, monkeypatch):
    wide = tmp_path / "ta_tok_32.pth"
    write_tatok_file(wide, feature_dim=2 * CAPTION_DIM)
    monkeypatch.setattr(mulo_pipeline, "decode_tar", None)
    monkeypatch.setattr(model_io, "read_weights", lambda *a: pytest.fail("weights read before the check"))
    overrides = tar_overrides(tar_root, "tar_512", PROMPT, f"models.folders.tatok={wide}")
    wrong = rf"target \(.*\) takes caption_dim {CAPTION_DIM} \(its clip_proj\), but the TA-Tok file .*_32.pth"
    wrong += r" gives 32-d features"
    with pytest.raises(ValueError, match=wrong):
        run(compose("decode", tmp_path, overrides))


def test_a_prefix_length_that_is_no_tatok_scale_is_an_error_before_any_weights(
    tar_root, tmp_path, monkeypatch
):
    source = tmp_path / "ar_dtok.pth"
    write_tar_ar_dtok(source, grid=TAR_GRIDS["tar_512"]["target"], cls_token_num=TATOK_TOKENS)
    args = [
        "tar-ar-dtok",
        str(source),
        str(tmp_path / "cond4"),
        "--n-head",
        str(GPT_HEADS),
        "--cond-len",
        "4",
    ]
    assert convert(args) == 0
    monkeypatch.setattr(mulo_pipeline, "decode_tar", None)
    monkeypatch.setattr(model_io, "read_weights", lambda *a: pytest.fail("weights read before the check"))
    overrides = tar_overrides(tar_root, "tar_512", PROMPT, f"models.folders.target={tmp_path / 'cond4'}")
    wrong = rf"target \(.*cond4/config.json\) has cond_len 4, but the TA-Tok file .* writes {TATOK_TOKENS} / "
    with pytest.raises(ValueError, match=wrong + r".*--cond-len <one of them>"):
        run(compose("decode", tmp_path, overrides))


def test_a_missing_tatok_file_names_the_download(tar_root, tmp_path, monkeypatch):
    forbid_weights(monkeypatch)
    overrides = tar_overrides(tar_root, "tar_512", PROMPT, "models.folders.tatok=no_such.pth")
    with pytest.raises(FileNotFoundError, match=r"tatok folder .*no_such.pth not found: download ta_tok.pth"):
        run(compose("decode", tmp_path, overrides))


def test_an_unconditional_tar_decode_is_refused(tar_root, tmp_path):
    overrides = tar_overrides(tar_root, "tar_512", "prompt=''", "unconditional=true")
    with pytest.raises(ValueError, match=r"decodes the TA-Tok tokens its MLLM writes for a prompt"):
        run(compose("decode", tmp_path, overrides))


# ---- training samplers against the AR-DTok target ------------------------------------------------------


def tatok_shard_samples(count: int, feature_seed: int, rows: int = TATOK_TOKENS, width: int = CAPTION_DIM):
    """Image shards with each image's TA-Tok features (tatok.npy), as docs/tar.md describes them; the images
    depend on nothing, the features on `feature_seed`."""
    generator = np.random.default_rng(feature_seed)
    for index in range(count):
        image, caption, _ = render_scene(1, index, 96)
        data = io.BytesIO()
        image.save(data, format="JPEG", quality=90)
        features = io.BytesIO()
        np.save(features, generator.standard_normal((rows, width)).astype(np.float32))
        yield {"__key__": f"{index:09d}", "jpg": data.getvalue(), "txt": caption.encode(),
               "tatok.npy": features.getvalue()}  # fmt: skip


def sampler_run(root, train: str, val: str, *extra: str) -> list[str]:
    """A few-step CPU run of experiment=tar/upsampler_r2 on the tiny tar_512 set."""
    grids = TAR_GRIDS["tar_512"]
    return [
        "experiment=tar/upsampler_r2", f"tar.root={root}", "trainer=cpu",
        f"data.train_shards='{train}'", f"data.val_shards={val}",
        f"data.image_size={16 * grids['target']}", f"data.extra_sizes=[{16 * grids['drafter_r2']}]",
        "data.batch_size=4", "data.val_samples=4", "data.num_workers=0", "data.shuffle_buffer=8",
        "data.train_samples_per_epoch=8", "model.sampler.width=16", "model.sampler.blocks=1",
        "trainer.max_steps=2", "trainer.val_check_interval=2", "callbacks.checkpoint.every_n_train_steps=2",
        "loss.lpips.net=alex", "loss.lpips.pretrained_backbone=false", *extra,
    ]  # fmt: skip


def test_the_upsampler_trains_and_validates_acceptance_under_the_ar_dtok_target(tar_root, tmp_path):
    write_shards(tatok_shard_samples(8, 0), str(tmp_path / "train"), "tar", shard_size=4)
    write_shards(tatok_shard_samples(4, 1), str(tmp_path / "val"), "tar", shard_size=4)
    train, val = tmp_path / "train" / "tar-{000000..000001}.tar", tmp_path / "val" / "tar-000000.tar"
    metrics = train_run(compose_train_config(tmp_path / "run", sampler_run(tar_root, train, val)))
    rates = [metrics[f"val/accept@{tau}"] for tau in (0.01, 0.05, 0.1)]
    assert all(0.0 <= rate <= 1.0 for rate in rates) and rates[0] >= rates[2]


def test_the_acceptance_metric_reads_the_stored_tatok_features(tar_root, tmp_path):
    """The same images under other TA-Tok features: another target distribution, another acceptance (the
    pixel-space twin is validated, so no trained weight differs)."""
    rates = []
    for seed in (1, 2):
        folder = tmp_path / f"features{seed}"
        write_shards(tatok_shard_samples(4, seed), str(folder), "tar", shard_size=4)
        shard = folder / "tar-000000.tar"
        only = ["validate_first=true", "trainer.max_steps=0", "model.pixel=bicubic"]
        metrics = train_run(compose_train_config(folder / "run", sampler_run(tar_root, shard, shard, *only)))
        rates.append([metrics[f"val/accept@{tau}"] for tau in (0.01, 0.05, 0.1)])
    assert 0 < rates[0][1] < 1 and rates[0] != rates[1]


def test_the_acceptance_condition_is_the_batchs_stored_tatok_features(tar_root):
    config = GPT.load_config(tar_root / TAR_FOLDERS["tar_512"]["target"])
    rows = [torch.randn(config.cond_len, config.caption_dim) for _ in range(2)]
    cond, mask = CaptionCondition(config)({"tatok": rows, "caption": ["a", "b"]}, torch.device("cpu"))
    assert mask is None and torch.equal(cond, torch.stack(rows))
    with pytest.raises(ValueError, match=r"has no 'tatok' rows: shards with a tatok.npy member per image"):
        CaptionCondition(config)({"caption": ["a"]}, torch.device("cpu"))
    short = [torch.randn(config.cond_len - 1, config.caption_dim)]
    with pytest.raises(
        ValueError, match=rf"rows have shapes \[\({config.cond_len - 1}, {config.caption_dim}\)\]"
    ):
        CaptionCondition(config)({"tatok": short}, torch.device("cpu"))
