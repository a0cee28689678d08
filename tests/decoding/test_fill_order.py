"""Teacher forcing in fill order (mulo_sd/nets/fill_order.py) reproduces the logits a ZipAR-style fill of an
empty grid samples from (grid_fill.fill), so a drafter trained with it is trained for how it is decoded."""

import pytest
import torch

from mulo_sd.decoding.methods.grid_fill import SlotGrid, fill
from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.nets.fill_order import fill_order
from mulo_sd.nets.gpt import GPT
from mulo_sd.nets.gpt_config import GPTConfig
from mulo_sd.nets.guidance import guide

H, W = 4, 6


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=32, grid_size=(H, W), dim=32, n_layer=2, n_head=4, cond_type="words", cond_len=3,
        cond_vocab_size=10, caption_dim=16, multiple_of=16, class_dropout_prob=0.1,
    )  # fmt: skip
    gpt = GPT(config).eval()
    torch.nn.init.normal_(gpt.output.weight, std=1.0)  # the LlamaGen init zeroes the head: all logits equal
    return gpt


class Recorder:
    """Passes `step` through and records each call's fed positions and their guided logits."""

    def __init__(self, model):
        self.model, self.outputs = model, []

    def step(self, state, tokens, positions):
        logits = self.model.step(state, tokens, positions)
        self.outputs.append(dict(zip(positions.tolist(), logits[0], strict=True)))
        return logits


def fill_empty(model, cond, window, cfg_scale, temperature, seed=0):
    recorder = Recorder(model)
    state = model.start(cond, cfg_scale)
    grid = SlotGrid(H * W)
    rows = [list(range(i * W, (i + 1) * W)) for i in range(H)]
    sampler = SamplerConfig(temperature=temperature, cfg_scale=cfg_scale)
    fill(recorder, state, grid, [rows], window, sampler, torch.Generator().manual_seed(seed))
    return grid.values, recorder.outputs


@torch.inference_mode()
def in_order_logits(model, tokens, cond, window, cfg_scale):
    order = fill_order(H, W, window)
    keep = torch.zeros(1, dtype=torch.bool)
    logits = model.forward_in_order(tokens[None], cond, order, drop=keep)[0]
    if cfg_scale == 1.0:
        return logits
    return guide(logits, model.forward_in_order(tokens[None], cond, order, drop=~keep)[0], cfg_scale)


@pytest.mark.parametrize("window", [1, 2, 3, 5, None, 9])
@pytest.mark.parametrize("cfg_scale", [1.0, 2.0])
def test_greedy_fill_draws_the_argmax_of_the_in_order_logits(model, window, cfg_scale):
    cond = torch.tensor([[1, 4, 7]])
    tokens, _ = fill_empty(model, cond, window, cfg_scale, temperature=0.0)
    logits = in_order_logits(model, tokens, cond, window, cfg_scale)
    assert torch.equal(logits.argmax(-1), tokens)


@pytest.mark.parametrize("window", [1, 2, 4])
def test_every_sampled_distribution_is_a_call_output_at_its_query(model, window):
    """Sampled at temperature 1: the in-order logits of token u equal what some fill call returned at slot
    u - 1 (the query), the row starts' included (asked from the stand-in slot before the row end exists)."""
    cond = torch.tensor([[2, 2, 9]])
    tokens, outputs = fill_empty(model, cond, window, 2.0, temperature=1.0, seed=3)
    logits = in_order_logits(model, tokens, cond, window, 2.0)
    for u in range(1, H * W):
        seen = [call[u - 1] for call in outputs if u - 1 in call]
        assert any(torch.allclose(out, logits[u], atol=1e-5) for out in seen), u
    # the raster teacher forcing does not: row i + 1's tokens were drawn without most of row i
    raster = in_order_logits(model, tokens, cond, None, 2.0)
    assert (raster - logits).abs().amax(-1)[W:].gt(1e-3).float().mean() > 0.5


def test_raster_order_is_the_plain_forward(model):
    cond, tokens = torch.tensor([[1, 4, 7]]), torch.randint(0, 32, (1, H * W), generator=torch.Generator())
    with torch.inference_mode():
        plain = model(tokens, cond, drop=torch.zeros(1, dtype=torch.bool))
        keep = torch.zeros(1, dtype=torch.bool)
        ordered = model.forward_in_order(tokens, cond, fill_order(H, W, None), drop=keep)
    torch.testing.assert_close(ordered, plain, rtol=0, atol=1e-5)


def test_window_one_slots_and_their_stand_ins():
    order = fill_order(3, 4, 1)
    # 11 fed tokens plus a stand-in for the row ends of rows 0 and 1, each holding its row's first token
    assert order.positions.tolist() == list(range(11)) + [3, 7]
    assert order.inputs.tolist()[11:] == [0, 4]
    assert order.predictors.tolist()[3] == 11 and order.predictors.tolist()[7] == 12
    # (1, 1) (position 5, drawn at step 2, asked from slot 4 in call 2) sees (0, 0), (0, 1), the stand-in at
    # (0, 3) and itself, not (0, 2) or (0, 3)'s true token (drawn at steps 2 and 3)
    assert order.visible[4].nonzero()[:, 0].tolist() == [0, 1, 4, 11]


@pytest.mark.parametrize("window", [0, -1, 1.5, True])
def test_bad_windows_are_refused(window):
    with pytest.raises(ValueError, match="window must be a positive integer"):
        fill_order(4, 4, window)
