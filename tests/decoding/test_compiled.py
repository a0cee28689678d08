"""Compiled decoding (mulo_sd/nets/compiled.py) gives the eager decode's tokens, through graphs without
breaks. Inductor compiles each (step kind, padded width, batch, model) once, some seconds each on a small
CPU, so the method-by-method comparisons are `slow`; the quick suite checks the graph and one padded step."""

import pytest
import torch

from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.evaluation.runs import expand_runs, reference_run
from mulo_sd.nets import compiled as compiled_module
from mulo_sd.nets.compiled import bucket, cache_forward, chunks, compiled
from mulo_sd.nets.slot_cache import PADDING
from tests.decoding.dispatch import decode_method
from tests.decoding.test_eagle2 import tiny_head
from tests.decoding.test_mulo import H, V, W
from tests.helpers import tiny_gpt

GUIDED = SamplerConfig(temperature=1.0, cfg_scale=2.0)
PROMPTS = torch.tensor([[1, 4, 7], [2, 2, 9]])
SEEDS = [11, 12]
NEIGHBOURS = torch.arange(V)[:, None].repeat(1, 4)
# the rotations are float32 (LlamaGen's tables), whose cos / sin inductor's kernels round their own way
CLOSE = dict(rtol=1e-5, atol=1e-6)
MULO = {"mulo": {"rejection": "local", "l": 1, "island_zipar_window": 2, "tau": 0.0001, "k": 2}}


@pytest.fixture(scope="module")
def models():
    target = tiny_gpt((H, W), V, 0)
    return target, tiny_gpt((H, W), V, 1), tiny_gpt((H // 2, W // 2), V, 1), tiny_head(target, 1)


def compiled_models(models):
    target, drafter, low_drafter, head = models
    return compiled(target, "cpu"), compiled(drafter, "cpu"), compiled(low_drafter, "cpu"), head


def test_bucket_is_the_next_power_of_two():
    assert [bucket(n) for n in (1, 2, 3, 4, 5, 9, 64, 65)] == [1, 2, 4, 4, 8, 16, 64, 128]


def test_a_step_that_would_pad_too_many_entries_runs_in_power_of_two_chunks():
    # MuLo-SD's second verification on the testbed: 128 drafts and one outdated slot
    assert chunks(129) == [128, 1]
    assert chunks(80) == [64, 16]
    assert [chunks(n) for n in (1, 3, 100, 255, 256)] == [[1], [3], [100], [255], [256]]


def test_chunked_steps_give_the_eager_logits(monkeypatch):
    # every width that is not a power of two split (3 -> 2 + 1), the positions fed out of order: each query
    # must still see the K/V of every fed entry at or below its slot, as in one call
    monkeypatch.setattr(compiled_module, "SPLIT_WASTE", 0)
    model = tiny_gpt((4, 4), 16, 0, n_layer=2)
    fast = compiled(model, "cpu")
    eager_state, state = model.start(PROMPTS, 2.0), fast.start(PROMPTS, 2.0)
    run, fed = fast._run, []
    fast._run = lambda state, tokens, slots: fed.append(slots.tolist()) or run(state, tokens, slots)
    for tokens, positions in ((torch.tensor([[3, 1, 4], [1, 5, 9]]), torch.tensor([5, 0, 2])),
                              (torch.tensor([[2, 6, 5], [3, 5, 8]]), torch.tensor([1, 9, 3]))):  # fmt: skip
        expected, got = model.step(eager_state, tokens, positions), fast.step(state, tokens, positions)
        torch.testing.assert_close(got, expected, **CLOSE)
    cond = model.config.cond_len
    assert fed == [[cond, cond + 2], [cond + 5], [cond + 1, cond + 3], [cond + 9]]
    grid = slice(0, state.num_slots)
    for mine, theirs in zip(state.keys + state.values, eager_state.keys + eager_state.values, strict=True):
        torch.testing.assert_close(mine[:, :, grid], theirs[:, :, grid], **CLOSE)


@pytest.mark.parametrize("per_row", [False, True], ids=["step", "step_rows"])
def test_compiled_function_has_no_graph_breaks(models, per_row):
    target = models[0]
    state = compiled(target, "cpu").start(PROMPTS, GUIDED.cfg_scale)
    slots = torch.tensor([3, 4]) + target.config.cond_len
    if per_row:
        slots = slots.expand(state.written.shape[0], -1)
    tokens = torch.zeros(state.written.shape[0], 2, dtype=torch.long)
    with torch.inference_mode():  # the state's K/V are inference tensors, as in a decode
        explained = torch._dynamo.explain(cache_forward)(
            target, tokens, slots, state.attention_mask(slots), state.keys, state.values
        )
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)


def test_padded_steps_give_the_eager_logits():
    # a one-layer model: 3 fed entries run padded to 4, per-row ones with PADDING too; K/V written alike
    model = tiny_gpt((4, 4), 16, 0, n_layer=1)
    fast = compiled(model, "cpu")
    eager_state, state = model.start(PROMPTS, 2.0), fast.start(PROMPTS, 2.0)
    eager_state.add_tree_slots(1)
    tokens, positions = torch.tensor([[3, 1, 4], [1, 5, 9]]), torch.tensor([0, 1, 2])
    expected, got = model.step(eager_state, tokens, positions), fast.step(state, tokens, positions)
    torch.testing.assert_close(got, expected, **CLOSE)
    rows = torch.tensor([[3, 4, PADDING], [3, PADDING, PADDING]])
    expected = model.step_rows(eager_state, tokens, rows)
    got = fast.step_rows(state, tokens, rows)
    torch.testing.assert_close(got[0, :2], expected[0, :2], **CLOSE)
    torch.testing.assert_close(got[1, :1], expected[1, :1], **CLOSE)
    grid = slice(0, state.num_slots)
    for mine, theirs in zip(state.keys, eager_state.keys, strict=True):
        torch.testing.assert_close(mine[:, :, grid], theirs[:, :, grid], **CLOSE)
    assert torch.equal(state.written, eager_state.written)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ar", "zipar", "lantern", "eagle2", *MULO])
def test_compiled_decode_equals_eager(models, name):
    # two prompts with a generator each: LANTERN and MuLo-SD decode them in lockstep (step and step_rows)
    def decode(these, seeds):
        generator = [torch.Generator().manual_seed(seed) for seed in seeds]
        return decode_method(
            name, these, PROMPTS[: len(seeds)], GUIDED, generator, NEIGHBOURS, MULO.get(name)
        )

    fast = compiled_models(models)
    for seeds in (SEEDS, SEEDS[:1]):
        eager = decode(models, seeds)
        got = decode(fast, seeds)
        assert torch.equal(got.tokens, eager.tokens)
        assert got.stats.target_forwards == eager.stats.target_forwards


def test_a_compiled_ar_run_stands_beside_the_eager_reference():
    runs = expand_runs([{"method": "ar"}, {"family": "AR (compiled)", "method": "ar", "compile": True}])
    assert [(run.label, run.compile) for run in runs] == [("ar", False), ("AR (compiled)", True)]
    assert reference_run(runs) is runs[0]


def test_every_width_compiles_each_step_width_at_the_first_start():
    # a 2x2 grid: widths 1, 2 and 4; after the first start no step of any width compiles a graph
    from torch._dynamo.utils import counters

    def graphs_after(model, widths):
        state = model.start(PROMPTS[:1])
        before = counters["stats"]["unique_graphs"]
        for n in widths:
            model.step(state, torch.zeros(1, n, dtype=torch.long), torch.arange(n))
        return counters["stats"]["unique_graphs"] - before

    lazy = compiled(tiny_gpt((2, 2), 16, 0, n_layer=1), "cpu")
    assert graphs_after(lazy, [3]) == 1  # the counter sees a compilation inside a step
    eager = tiny_gpt((2, 2), 16, 1, n_layer=1)
    ahead = compiled(eager, "cpu", every_width=True)
    state = ahead.start(PROMPTS[:1])
    assert graphs_after(ahead, [1, 2, 3, 4]) == 0
    state2 = eager.start(PROMPTS[:1])
    state2.add_tree_slots(1)
    tokens = torch.tensor([[3, 1, 4]])
    expected = eager.step(state2, tokens, torch.arange(3))
    torch.testing.assert_close(ahead.step(state, tokens, torch.arange(3)), expected, **CLOSE)
