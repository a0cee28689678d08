"""`MuLoPipeline` on a tiny Tar set (tests/tar_fixtures.py): a prompt decodes as decode_tar does, in two
stages; a condition (TA-Tok features) decodes the AR-DTok stage alone, without loading the MLLM; and
`mulo-decode` writes decode_tar's image byte for byte."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch
from mulo_sd.training.decode import run

from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.pipeline import MuLoPipeline, decode_tar, load_model_set, tensor_to_pil
from tests.pipeline.test_pipeline import counts
from tests.tar.test_tar_set import tar_set
from tests.tar_fixtures import tar_overrides, write_tar_set
from tests.training.test_decode_cli import compose

PROMPTS = ["a photo of a macaw", "a red bus"]
KNOBS = {"r": 2, "tau": 0.05}  # tar_512's r=2 and a threshold the tiny random models accept at
SAMPLER = SamplerConfig(cfg_scale=4.0)  # conf/models/tar_1024.yaml's sampler and mllm_sampler
MLLM_SAMPLER = SamplerConfig(top_k=1200, top_p=0.95)
STAGE_2 = ["vq", "target", "drafter_r2", "upsampler_r2", "downsampler_r2"]


@pytest.fixture(scope="module")
def tar_root(tmp_path_factory):
    return write_tar_set(tmp_path_factory.mktemp("tar_ckpts"))


@pytest.fixture(scope="module")
def low_level(tar_root):
    """decode_tar on each prompt alone: the pipeline's reference."""
    models = load_model_set(tar_set(tar_root), STAGE_2)
    return [decode_tar("mulo", models, [p], KNOBS, SAMPLER, MLLM_SAMPLER, seed=5) for p in PROMPTS]


def tar_512(root) -> MuLoPipeline:
    return MuLoPipeline.from_pretrained("tar_512", root=root, device="cpu", dtype="float32")


def test_a_prompt_decodes_in_two_stages_as_decode_tar(tar_root, low_level):
    out = tar_512(tar_root)(PROMPTS, "mulo", seed=5, tau=0.05)  # r=2: the set's own knob
    for i, tar in enumerate(low_level):
        assert torch.equal(out.tokens[i : i + 1], tar.result.tokens)
        assert counts(out.stats[i]) == counts(tar.result.stats)
        assert out.rows[i].keys() == tar.as_dict().keys()  # mllm/..., ar_dtok/..., end_to_end_wall_s


def test_a_condition_decodes_the_ar_dtok_stage_without_the_mllm(tar_root, low_level, monkeypatch):
    monkeypatch.setitem(sys.modules, "mulo_sd.tar.mllm", types.ModuleType("no_mllm"))  # loading it fails
    pipe = tar_512(tar_root)
    features = torch.cat([tar.features for tar in low_level])  # [2, TA-Tok tokens, caption_dim]
    out = pipe(condition=features, method="mulo", seed=5, tau=0.05)
    assert pipe.models.mllm is None and set(pipe.models.drafters) == {"drafter_r2"}
    for i, tar in enumerate(low_level):
        assert torch.equal(out.tokens[i : i + 1], tar.result.tokens)
        assert out.images[i].tobytes() == tensor_to_pil(tar.result.image[0]).tobytes()
    with pytest.raises(ValueError, match=r"give prompts or a condition, not both"):
        pipe(PROMPTS, condition=features)
    monkeypatch.undo()
    again = pipe(PROMPTS[1], "mulo", seed=5, tau=0.05)  # a prompt now: the MLLM loads with the rest
    assert pipe.models.mllm is not None and torch.equal(again.tokens, low_level[1].result.tokens)


def test_mulo_decode_writes_decode_tars_image_and_tokens(tar_root, low_level, tmp_path):
    out = tmp_path / "sample.png"
    extra = ["method=mulo", "knobs.tau=0.05", "seed=5", f"prompt='{PROMPTS[0]}'", f"out={out}"]
    extra.append("save_tokens=true")
    run(compose("decode", tmp_path, tar_overrides(tar_root, "tar_512", *extra)))
    tensor_to_pil(low_level[0].result.image[0]).save(tmp_path / "low.png")
    assert out.read_bytes() == (tmp_path / "low.png").read_bytes()
    assert np.array_equal(np.load(tmp_path / "sample.tokens.npy"), low_level[0].result.tokens[0].numpy())
