"""`mulo-decode` decodes through MuLoPipeline: the image it writes is, byte for byte, the one the low-level
path (load_models, decode, tensor_to_pil) gives, and save_tokens=true writes its token grid beside it."""

from __future__ import annotations

import numpy as np
import pytest
from mulo_sd.training.decode import run

from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.pipeline import decode, load_models, required_models, tensor_to_pil
from tests.training.test_decode_cli import PROMPT, at, compose, save_tiny_testbed

CASES = {
    "mulo": (["knobs.tau=0.1"], {"tau": 0.1}),
    "lantern": (["knobs.k=4"], {"k": 4}),
    "zipar": (["knobs.window=2"], {"window": 2}),
}


@pytest.fixture(scope="module")
def testbed(tmp_path_factory):
    return save_tiny_testbed(tmp_path_factory.mktemp("testbed"))


@pytest.mark.parametrize("method", list(CASES))
def test_the_png_is_the_low_level_paths_byte_for_byte(testbed, tmp_path, method):
    overrides, knobs = CASES[method]
    out = tmp_path / "sample.png"
    run(compose("decode", tmp_path, [f"method={method}", *overrides, *at(testbed), "seed=7", f"out={out}"]))
    models = load_models(testbed, names=required_models(method, knobs))
    low = decode(method, models, [PROMPT], knobs, SamplerConfig(cfg_scale=2.0), seed=7)
    tensor_to_pil(low.image[0]).save(tmp_path / "low.png")
    assert out.read_bytes() == (tmp_path / "low.png").read_bytes()
    assert not (tmp_path / "sample.tokens.npy").exists()  # only with save_tokens=true


def test_save_tokens_writes_the_token_grid_beside_the_image(testbed, tmp_path):
    out = tmp_path / "images" / "sample.jpg"
    overrides = ["method=ar", *at(testbed), "seed=2", f"out={out}", "save_tokens=true"]
    run(compose("decode", tmp_path, overrides))
    tokens = np.load(tmp_path / "images" / "sample.tokens.npy")
    models = load_models(testbed, names=["vq", "target"])
    low = decode("ar", models, [PROMPT], {}, SamplerConfig(cfg_scale=2.0), seed=2)
    assert tokens.dtype == np.int64 and tokens.shape == (8, 8)
    assert np.array_equal(tokens, low.tokens[0].numpy()) and out.is_file()
