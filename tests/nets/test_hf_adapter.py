"""HFCausalLM: a transformers causal LM decoded through the slot cache behaves like its own full forward."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

from mulo_sd.nets import hf_adapter
from mulo_sd.nets.guidance import guide
from mulo_sd.nets.hf_adapter import HFCausalLM

GRID = 4
LM_VOCAB = 80
OFFSET = 16  # image token i is LM token 16 + i: the LM also holds "text" tokens below the image ones
VOCAB = LM_VOCAB - OFFSET
UNCOND = torch.tensor([1, 2, 3])


def make_lm(attn_implementation="sdpa"):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=LM_VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation=attn_implementation,
    )
    return LlamaForCausalLM(config).double().eval()


def make_adapter(lm=None):
    return HFCausalLM(lm or make_lm(), GRID, uncond=UNCOND, image_token_offset=OFFSET)


def random_ids(shape, high, seed):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


def full_forward(lm, prefix, tokens, cfg_scale=1.0):
    """Guided image logits [B, T, V] from plain forwards over prefix + tokens (no cache, causal)."""

    def image_logits(prefix):
        with torch.no_grad():
            logits = lm(torch.cat([prefix, tokens[:, :-1] + OFFSET], dim=1)).logits
        return logits[:, prefix.shape[1] - 1 :, OFFSET:]

    logits = image_logits(prefix)
    if cfg_scale == 1.0:
        return logits
    return guide(logits, image_logits(UNCOND.expand(prefix.shape[0], -1)), cfg_scale)


def decode_one_by_one(adapter, state, tokens):
    out = [state.first_logits[:, None]]
    for t in range(tokens.shape[1] - 1):
        out.append(adapter.step(state, tokens[:, t : t + 1], torch.tensor([t])))
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("cfg_scale", [1.0, 2.5])
def test_stepwise_decoding_equals_full_forward(cfg_scale):
    adapter = make_adapter()
    prefix, tokens = random_ids((2, 3), OFFSET, 1), random_ids((2, GRID * GRID), VOCAB, 2)
    got = decode_one_by_one(adapter, adapter.start(prefix, cfg_scale), tokens)
    assert got.shape == (2, GRID * GRID, VOCAB)
    want = full_forward(adapter.model, prefix, tokens, cfg_scale)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_embedding_prefix_equals_id_prefix():
    adapter = make_adapter()
    prefix, tokens = random_ids((2, 3), OFFSET, 1), random_ids((2, GRID * GRID), VOCAB, 2)
    embeds = adapter.model.get_input_embeddings()(prefix)
    got = decode_one_by_one(adapter, adapter.start(embeds, 1.0), tokens)
    torch.testing.assert_close(got, full_forward(adapter.model, prefix, tokens), rtol=0, atol=1e-10)


def test_out_of_order_writes_and_overwrites():
    adapter = make_adapter()
    prefix, tokens = random_ids((2, 3), OFFSET, 1), random_ids((2, GRID * GRID), VOCAB, 2)
    junk = random_ids((2, GRID * GRID), VOCAB, 3)
    state = adapter.start(prefix, 2.5)
    for p in torch.randperm(GRID * GRID, generator=torch.Generator().manual_seed(4)):
        adapter.step(state, junk[:, p : p + 1], p.reshape(1))
    got = decode_one_by_one(adapter, state, tokens)  # overwrite every slot in raster order
    torch.testing.assert_close(got, full_forward(adapter.model, prefix, tokens, 2.5), rtol=0, atol=1e-10)


def test_multi_token_steps_fork_and_select():
    adapter = make_adapter()
    prefix, tokens = random_ids((2, 3), OFFSET, 1), random_ids((2, GRID * GRID), VOCAB, 2)
    want = full_forward(adapter.model, prefix, tokens, 2.5)
    state = adapter.start(prefix, 2.5)
    chunk = torch.tensor([3, 0, 2, 1])
    got = adapter.step(state, tokens[:, chunk], chunk)
    torch.testing.assert_close(got, want[:, chunk + 1], rtol=0, atol=1e-10)
    forked = state.fork(2).select([3, 0])  # rows: prompt 1, prompt 0
    got = adapter.step(forked, tokens[[1, 0], 4:9], torch.arange(4, 9))
    torch.testing.assert_close(got, want[[1, 0], 5:10], rtol=0, atol=1e-10)


class FreshCachePerStep(HFCausalLM):
    """The adapter as it was before it kept its cache: a new StaticCache over the state's K/V every step."""

    def _lend(self, state):
        cache = hf_adapter.StaticCache(config=self.model.config, max_cache_len=state.num_slots)
        for layer, keys, values in zip(cache.layers, state.keys, state.values, strict=True):
            layer.max_batch_size, layer.num_heads, _, layer.head_dim = keys.shape
            layer.dtype, layer.device = keys.dtype, keys.device
            layer.keys, layer.values = keys, values
            layer.is_initialized = True
        return cache


def test_one_cache_serves_every_step_and_fork_with_the_logits_of_fresh_caches(monkeypatch):
    built = []

    class CountedCache(StaticCache):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(hf_adapter, "StaticCache", CountedCache)
    lm = make_lm()
    prefix, tokens = random_ids((2, 3), OFFSET, 1), random_ids((2, GRID * GRID), VOCAB, 2)
    results = []
    for adapter in (make_adapter(lm), FreshCachePerStep(lm, GRID, uncond=UNCOND, image_token_offset=OFFSET)):
        built.clear()
        state = adapter.start(prefix, 2.5)
        logits = decode_one_by_one(adapter, state, tokens[:, :9])
        forked = state.fork(2).select([3, 0])  # other K/V tensors: the cache is re-pointed, not rebuilt
        logits = torch.cat([logits, adapter.step(forked, tokens[[1, 0], 8:12], torch.arange(8, 12))], dim=1)
        results.append((logits, len(built)))
    (reused, reused_built), (fresh, fresh_built) = results
    assert (reused_built, fresh_built) == (1, 1 + 8 + 1)  # start's cache, then one per step when fresh
    torch.testing.assert_close(reused, fresh, rtol=0, atol=0)
    torch.testing.assert_close(
        reused[:, :9], full_forward(lm, prefix, tokens, 2.5)[:, :9], rtol=0, atol=1e-10
    )


def test_prefix_padding_is_invisible():
    adapter = make_adapter()
    prefix, tokens = random_ids((2, 4), OFFSET, 1), random_ids((2, GRID * GRID), VOCAB, 2)
    mask = torch.tensor([[False, True, True, True], [False, False, True, True]])
    got = decode_one_by_one(adapter, adapter.start(prefix, 1.0, cond_mask=mask), tokens)
    other_padding = torch.where(mask, prefix, (prefix + 5) % OFFSET)
    again = decode_one_by_one(adapter, adapter.start(other_padding, 1.0, cond_mask=mask), tokens)
    torch.testing.assert_close(again, got, rtol=0, atol=1e-10)
    assert (decode_one_by_one(adapter, adapter.start(prefix, 1.0), tokens) - got).abs().max() > 1e-3


def test_eager_attention_is_refused_because_it_adds_a_boolean_mask():
    """transformers' eager attention adds the 4-D mask to the scores, so True would count as +1."""
    with pytest.raises(ValueError, match="attn_implementation='sdpa'"):
        make_adapter(make_lm("eager"))
    eager, sdpa = make_lm("eager"), make_lm("sdpa")
    ids = random_ids((1, 5), LM_VOCAB, 5)
    allowed = torch.ones(5, 5, dtype=torch.bool).tril()[None, None]
    with torch.no_grad():
        torch.testing.assert_close(sdpa(ids, attention_mask=allowed).logits, sdpa(ids).logits)
        assert (eager(ids, attention_mask=allowed).logits - eager(ids).logits).abs().max() > 1e-3


def test_bad_input_is_refused():
    adapter = make_adapter()
    state = adapter.start(random_ids((1, 3), OFFSET, 1), 2.5)
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 16\)"):
        adapter.step(state, torch.tensor([[1]]), torch.tensor([16]))
    with pytest.raises(ValueError, match=r"tokens must lie in \[0, 64\)"):
        adapter.step(state, torch.tensor([[64]]), torch.tensor([0]))
    with pytest.raises(ValueError, match=r"uncond must match one condition row \(shape \[4\], ids\)"):
        adapter.start(random_ids((1, 4), OFFSET, 1), 2.5)
    with pytest.raises(ValueError, match="needs the unconditional prefix"):
        HFCausalLM(adapter.model, GRID).start(random_ids((1, 3), OFFSET, 1), 2.5)
    with pytest.raises(ValueError, match=r"cond must be prefix ids \[B, L\] or embeddings \[B, L, 32\]"):
        adapter.start(torch.zeros(1, 3, 8, dtype=torch.float64), 1.0)
    with pytest.raises(ValueError, match=r"image tokens \[16, 96\) exceed the LM vocabulary of 80"):
        HFCausalLM(adapter.model, GRID, image_token_offset=OFFSET, vocab_size=80)
