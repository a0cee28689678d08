"""GPT: slot-cache decoding equals the full forward, the official presets have the published shapes, bad
input is refused (official files: tests/llamagen/test_official_models.py)."""

import pytest
import torch

from mulo_sd.nets import GPT, GPTConfig
from mulo_sd.nets.guidance import guide

GRID = (3, 4)  # not square, so rows and columns of the 2-D RoPE cannot be swapped unnoticed
VOCAB = 64


def make_config(cond_type="words", position="rope2d", **overrides):
    fields = dict(
        vocab_size=VOCAB,
        grid_size=GRID,
        dim=32,
        n_layer=2,
        n_head=4,
        n_kv_head=2,
        multiple_of=16,
        cond_type=cond_type,
        cond_len=1 if cond_type == "class" else 3,
        position=position,
        cond_vocab_size=20,
        caption_dim=12,
        num_classes=10,
    )
    return GPTConfig(**{**fields, **overrides})


def make_model(config, seed=0):
    """float64, every weight random (the default init zeroes the output head, which would hide bugs)."""
    torch.manual_seed(seed)
    model = GPT(config).double().eval()
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.normal_(0, 0.3)
    return model


def make_cond(config, batch, seed=1):
    g = torch.Generator().manual_seed(seed)
    if config.cond_type == "class":
        return torch.randint(0, config.num_classes, (batch,), generator=g)
    if config.cond_type == "words":
        return torch.randint(0, config.cond_vocab_size, (batch, config.cond_len), generator=g)
    return torch.randn(batch, config.cond_len, config.caption_dim, generator=g, dtype=torch.float64)


def random_tokens(batch, seed=2, n=GRID[0] * GRID[1]):
    return torch.randint(0, VOCAB, (batch, n), generator=torch.Generator().manual_seed(seed))


def reference(model, tokens, cond, cfg_scale, cond_mask=None):
    """Guided logits from two separate full forwards (conditional, unconditional)."""
    with torch.no_grad():
        logits = model(tokens, cond, cond_mask)
        if cfg_scale == 1.0:
            return logits
        drop = torch.ones(tokens.shape[0], dtype=torch.bool)
        return guide(logits, model(tokens, cond, cond_mask, drop=drop), cfg_scale)


def decode_one_by_one(model, state, tokens):
    """first_logits, then one step per grid position in raster order -> [B, T, V]."""
    out = [state.first_logits[:, None]]
    for t in range(tokens.shape[1] - 1):
        out.append(model.step(state, tokens[:, t : t + 1], torch.tensor([t])))
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
@pytest.mark.parametrize("cond_type", ["words", "t5", "class", "tatok"])
@pytest.mark.parametrize("position", ["rope2d", "rope1d", "absolute"])
def test_stepwise_decoding_equals_full_forward(position, cond_type, cfg_scale):
    config = make_config(cond_type, position)
    model = make_model(config)
    cond, tokens = make_cond(config, 2), random_tokens(2)
    state = model.start(cond, cfg_scale)
    assert state.first_logits.shape == (2, VOCAB)
    assert state.keys[0].shape == (2 * (2 if cfg_scale != 1 else 1), 2, config.num_slots, 8)
    got = decode_one_by_one(model, state, tokens)
    want = reference(model, tokens, cond, cfg_scale)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    assert (got[:, 1:] - got[:, :-1]).abs().max() > 1e-3  # the comparison is not between constants


@pytest.mark.parametrize("position", ["rope2d", "rope1d"])
def test_content_addressable_prefix_decodes_like_full_forward(position):
    config = make_config("words", position, prefix_rotation="identity", word_positions=True)
    model = make_model(config)
    cond, tokens = make_cond(config, 2), random_tokens(2)
    got = decode_one_by_one(model, model.start(cond, 2.0), tokens)
    torch.testing.assert_close(got, reference(model, tokens, cond, 2.0), rtol=0, atol=1e-10)


def test_prefix_rotation_and_word_positions_change_what_the_grid_reads():
    """'zero' (LlamaGen) gives every prefix key zero, so a grid query weighs all words alike; 'identity' keeps
    the keys; word positions make the order of the words matter."""
    base = make_config("words")
    zero, identity = make_model(base), make_model(make_config("words", prefix_rotation="identity"))
    identity.load_state_dict(zero.state_dict())  # the same weights: only the rotation differs
    cond, tokens = make_cond(base, 1), random_tokens(1)
    assert (zero(tokens, cond) - identity(tokens, cond)).abs().max() > 1e-3
    ordered = make_model(make_config("words", prefix_rotation="identity", word_positions=True))
    swapped = cond[:, [1, 0, 2]]
    assert (ordered(tokens, cond) - ordered(tokens, swapped)).abs().max() > 1e-3


def test_condition_padding_is_invisible():
    config = make_config("t5")
    model = make_model(config)
    cond, tokens = make_cond(config, 2), random_tokens(2)
    cond_mask = torch.tensor([[False, True, True], [False, False, True]])  # left padding, as LlamaGen
    state = model.start(cond, 2.0, cond_mask=cond_mask)
    got = decode_one_by_one(model, state, tokens)
    torch.testing.assert_close(got, reference(model, tokens, cond, 2.0, cond_mask), rtol=0, atol=1e-10)
    changed = cond.clone()
    changed[0, 0] += 5.0
    changed[1, :2] -= 3.0
    other = decode_one_by_one(model, model.start(changed, 2.0, cond_mask=cond_mask), tokens)
    torch.testing.assert_close(other, got, rtol=0, atol=1e-10)
    unmasked = decode_one_by_one(model, model.start(cond, 2.0), tokens)
    assert (unmasked - got).abs().max() > 1e-3


def test_out_of_order_writes_and_overwrites():
    config = make_config("words", "rope2d")
    model = make_model(config)
    cond, tokens = make_cond(config, 2), random_tokens(2)
    junk = random_tokens(2, seed=7)
    state = model.start(cond, 2.0)
    order = torch.randperm(config.num_tokens, generator=torch.Generator().manual_seed(3))
    for p in order:  # every slot written once, out of order, with other tokens
        model.step(state, junk[:, p : p + 1], p.reshape(1))
    got = decode_one_by_one(model, state, tokens)  # overwrite every slot in raster order
    # each query sees exactly the overwritten slots before it; the junk after it stays invisible
    torch.testing.assert_close(got, reference(model, tokens, cond, 2.0), rtol=0, atol=1e-10)


def test_unwritten_and_later_slots_are_invisible():
    config = make_config("t5", "rope1d")
    model = make_model(config)
    cond, tokens = make_cond(config, 1), random_tokens(1)

    def logits_at_8(extra_positions):
        state = model.start(cond, 1.0)
        model.step(state, tokens[:, :4], torch.arange(4))
        for p in extra_positions:
            model.step(state, tokens[:, p : p + 1], torch.tensor([p]))
        return model.step(state, tokens[:, 8:9], torch.tensor([8]))

    plain = logits_at_8([])
    torch.testing.assert_close(logits_at_8([10, 11]), plain, rtol=0, atol=1e-12)  # later slots: invisible
    assert (logits_at_8([5]) - plain).abs().max() > 1e-3  # an earlier written slot is seen


def test_multi_token_steps_equal_single_token_steps():
    config = make_config("class", "rope2d")
    model = make_model(config)
    cond, tokens = make_cond(config, 2), random_tokens(2)
    single = decode_one_by_one(model, model.start(cond, 1.5), tokens)
    state = model.start(cond, 1.5)
    first = model.step(state, tokens[:, :5], torch.arange(5))
    chunk = torch.tensor([9, 5, 10, 7, 6, 8])  # one call, shuffled: each query still sees slots <= its own
    second = model.step(state, tokens[:, chunk], chunk)
    torch.testing.assert_close(first, single[:, 1:6], rtol=0, atol=1e-10)
    torch.testing.assert_close(second, single[:, chunk + 1], rtol=0, atol=1e-10)


def test_fork_and_select_match_separate_runs():
    config = make_config("t5", "absolute")
    model = make_model(config)
    cond = make_cond(config, 2)
    tokens = random_tokens(6, seed=4)
    state = model.start(cond, 2.0)
    model.step(state, tokens[:2, :3], torch.arange(3))
    forked = state.fork(3)  # rows: cond0, cond0, cond0, cond1, cond1, cond1
    assert forked.batch_size == 6 and forked.written.shape[0] == 12
    continued = model.step(forked, tokens[:, 3:7], torch.arange(3, 7))
    for row in range(6):
        alone = model.start(cond[row // 3 : row // 3 + 1], 2.0)
        model.step(alone, tokens[row // 3 : row // 3 + 1, :3], torch.arange(3))
        want = model.step(alone, tokens[row : row + 1, 3:7], torch.arange(3, 7))
        torch.testing.assert_close(continued[row : row + 1], want, rtol=0, atol=1e-10)
    picked = forked.select([4, 0])
    again = model.step(picked, tokens[[4, 0], 7:9], torch.arange(7, 9))
    reference_rows = model.step(forked, tokens[:, 7:9], torch.arange(7, 9))[[4, 0]]
    torch.testing.assert_close(again, reference_rows, rtol=0, atol=1e-10)
    torch.testing.assert_close(picked.first_logits, state.first_logits[[1, 0]])


def test_clone_is_independent():
    config = make_config("words")
    model = make_model(config)
    cond, tokens = make_cond(config, 1), random_tokens(1)
    state = model.start(cond, 1.0)
    model.step(state, tokens[:, :2], torch.arange(2))
    copy = state.clone()
    model.step(copy, random_tokens(1, seed=9)[:, :1], torch.tensor([1]))  # overwrite slot 1 in the copy
    torch.testing.assert_close(
        model.step(state, tokens[:, 2:3], torch.tensor([2])),
        reference(model, tokens, cond, 1.0)[:, 3:4],
        rtol=0,
        atol=1e-10,
    )


def test_decoding_does_not_touch_the_model():
    model = make_model(make_config("words"))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    attributes = set(vars(model)) | {name for name, _ in model.named_modules()}
    state = model.start(make_cond(model.config, 1), 2.0)
    model.step(state, random_tokens(1)[:, :3], torch.arange(3))
    assert set(vars(model)) | {name for name, _ in model.named_modules()} == attributes
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_rope2d_layout_matches_llamagen():
    """LlamaGen's precompute_freqs_cis_2d: zero rows for the prefix; per grid cell (y, x) the first half of
    the pair angles is y * f_i, the second x * f_i, with f_i = base^(-2i / (head_dim / 2))."""
    config = GPTConfig(
        vocab_size=8, grid_size=(2, 3), dim=16, n_layer=1, n_head=2, cond_type="t5", cond_len=2
    )
    cos, sin = GPT(config)._rotation(torch.arange(8))
    assert cos[:2].abs().max() == 0 and sin[:2].abs().max() == 0
    freqs = torch.tensor([1.0, 0.01])  # head_dim 8: half 4, f = 10000^(-[0, 2] / 4)
    for p in range(6):
        y, x = divmod(p, 3)
        angles = torch.cat([y * freqs, x * freqs])
        torch.testing.assert_close(cos[2 + p], angles.cos())
        torch.testing.assert_close(sin[2 + p], angles.sin())


def test_training_dropout_uses_the_unconditional_prefix():
    config = make_config("t5", class_dropout_prob=1.0)
    model = make_model(config)
    cond, tokens = make_cond(config, 2), random_tokens(2)
    model.train()
    with torch.no_grad():
        dropped = model(tokens, cond)
        model.eval()
        torch.testing.assert_close(dropped, model(tokens, cond, drop=torch.ones(2, dtype=torch.bool)))
        assert (model(tokens, cond) - dropped).abs().max() > 1e-3


def test_save_and_load_pretrained(tmp_path):
    model = make_model(make_config("words", "absolute"))
    model.save_pretrained(tmp_path / "gpt")
    loaded = GPT.from_pretrained(tmp_path / "gpt").double()
    assert loaded.config == model.config and loaded.config.grid_size == GRID
    cond, tokens = make_cond(model.config, 1), random_tokens(1)
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens, cond), model(tokens, cond))


def test_official_presets_have_the_published_shapes():
    t2i = GPTConfig.llamagen_t2i_xl(512)
    assert (t2i.grid_size, t2i.dim, t2i.n_layer, t2i.n_head, t2i.cond_len) == ((32, 32), 1280, 36, 20, 120)
    assert t2i.ffn_hidden == 3584  # find_multiple(int(2 * 4 * 1280 / 3), 256)
    tar = GPTConfig.tar_ar_dtok(1024, cond_len=169)
    assert (tar.grid_size, tar.n_layer, tar.cond_len, tar.n_positions) == ((64, 64), 30, 169, 4096 + 728)
    with pytest.raises(ValueError, match="multiple of the VQ downsampling factor 16"):
        GPTConfig.llamagen_t2i_xl(300)


# ---- bad input --------------------------------------------------------------------------------------


def test_step_refuses_bad_input():
    model = make_model(make_config("words"))
    state = model.start(make_cond(model.config, 2), 2.0)
    tokens = random_tokens(2)[:, :2]
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 12\) \(the grid\), got min 11 max 12"):
        model.step(state, tokens, torch.tensor([11, 12]))
    with pytest.raises(ValueError, match=r"got min -1"):
        model.step(state, tokens, torch.tensor([-1, 0]))
    with pytest.raises(ValueError, match=r"distinct within one step, got \[3, 3\]"):
        model.step(state, tokens, torch.tensor([3, 3]))
    with pytest.raises(
        ValueError, match=r"tokens must lie in \[0, 64\) \(the vocabulary\), got min \d+ max 64"
    ):
        model.step(state, torch.tensor([[1, 64], [0, 2]]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"tokens must lie in \[0, 64\).*got min -3"):
        model.step(state, torch.tensor([[1, -3], [0, 2]]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"tokens must have shape \[batch=2, n=3\].*got \[2, 2\]"):
        model.step(state, tokens, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="1-D integer tensor"):
        model.step(state, tokens, torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match="tokens must be an integer tensor"):
        model.step(state, tokens.double(), torch.tensor([0, 1]))
    other = make_model(make_config("words", cond_len=4))
    with pytest.raises(ValueError, match="not made by this model"):
        other.step(state, tokens, torch.tensor([0, 1]))


def test_start_and_forward_refuse_bad_conditions():
    t5 = make_model(make_config("t5"))
    message = r"cond for cond_type 't5' must be T5 features \[B, 3, 12\].*got shape \[2, 4, 12\]"
    with pytest.raises(ValueError, match=message):
        t5.start(torch.zeros(2, 4, 12, dtype=torch.float64), 1.0)
    with pytest.raises(ValueError, match=r"cond_mask must have shape \[2, 3\], got \[2, 2\]"):
        t5.start(torch.zeros(2, 3, 12, dtype=torch.float64), cond_mask=torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"tokens must be integer ids of shape \[B=2, T\] with 1 <= T <= 12"):
        t5(random_tokens(2, n=13), torch.zeros(2, 3, 12, dtype=torch.float64))
    words = make_model(make_config("words"))
    with pytest.raises(ValueError, match=r"caption word ids \[B, 3\] \(integer\)"):
        words.start(torch.zeros(1, 3), 1.0)
    with pytest.raises(ValueError, match=r"cond ids must lie in \[0, 20\), got min 0 max 20"):
        words.start(torch.tensor([[0, 5, 20]]), 1.0)
    no_null = make_model(make_config("class", class_dropout_prob=0.0))
    with pytest.raises(ValueError, match="needs an unconditional class row"):
        no_null.start(torch.tensor([1]), 2.0)
    with pytest.raises(ValueError, match="takes no cond_mask"):
        no_null.start(torch.tensor([1]), 1.0, cond_mask=torch.ones(1, 1, dtype=torch.bool))


def test_config_refuses_inconsistent_fields():
    with pytest.raises(ValueError, match="cond_type must be one of"):
        make_config("clip")
    with pytest.raises(ValueError, match=r"prefix_rotation must be one of \('zero', 'identity'\), got 'one'"):
        make_config(prefix_rotation="one")
    with pytest.raises(ValueError, match="word_positions needs cond_type 'words', got 't5'"):
        make_config("t5", word_positions=True)
    with pytest.raises(ValueError, match="'rope2d' needs head_dim divisible by 4"):
        make_config(dim=24, n_head=4)
    with pytest.raises(ValueError, match="n_head 4 is not a multiple of n_kv_head 3"):
        make_config(n_kv_head=3)
    with pytest.raises(ValueError, match=r"n_positions 10 < 14"):
        make_config(position="absolute", n_positions=10)
