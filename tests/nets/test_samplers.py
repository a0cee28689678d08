import pytest
import torch
import torch.nn as nn

from mulo_sd.nets.downsampler import Downsampler, DownsamplerConfig
from mulo_sd.nets.masked_conv import RowCausalConv2d
from mulo_sd.nets.pixel_samplers import PixelDownsampler, PixelUpsampler
from mulo_sd.nets.upsampler import (
    Upsampler,
    UpsamplerConfig,
    nearest_entries,
    soft_codes,
    straight_through_codes,
)
from mulo_sd.nets.vq import VQModel
from tests import helpers

V, D = 32, 4
TINY = dict(codebook_size=V, code_dim=D, width=16, blocks=2, kernel=3)


def tiny_vq(codebook_size: int = V, seed: int = 0, **overrides) -> VQModel:
    fields = dict(z_channels=16, ch=16, norm_groups=8) | overrides
    return helpers.tiny_vq(seed, codebook_size, (1, 2, 2, 4), **fields)


def codebook(seed: int = 0) -> torch.Tensor:
    return tiny_vq(seed=seed).codebook.detach()


def upsampler(r: int = 2, **overrides) -> Upsampler:
    torch.manual_seed(1)
    return Upsampler(UpsamplerConfig(r=r, **{**TINY, **overrides}), codebook()).eval()


def downsampler(r: int = 2, **overrides) -> Downsampler:
    torch.manual_seed(2)
    return Downsampler(DownsamplerConfig(r=r, **{**TINY, **overrides}), codebook()).eval()


def grid(h: int, w: int, seed: int = 0, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, V, (batch, h, w), generator=torch.Generator().manual_seed(seed))


def perturb_row(ids: torch.Tensor, row: int) -> torch.Tensor:
    changed = ids.clone()
    changed[:, row] = (changed[:, row] + 1 + torch.arange(ids.shape[2]) % (V - 1)) % V
    return changed


def test_masked_taps_stay_zero_after_optimiser_step():
    torch.manual_seed(0)
    conv = RowCausalConv2d(3, 5, 5)
    optimiser = torch.optim.AdamW(conv.parameters(), lr=0.1, weight_decay=0.5)
    with torch.no_grad():
        conv.weight.add_(1.0)  # raw weights below the centre row are now non-zero: the mask must still hold
    conv(torch.randn(2, 3, 6, 6)).square().sum().backward()
    optimiser.step()
    assert conv.weight[:, :, 3:].abs().sum() > 0
    assert torch.equal(conv.masked_weight[:, :, 3:], torch.zeros_like(conv.weight[:, :, 3:]))
    assert conv.masked_weight[:, :, :3].abs().min() > 0  # taps on and above the centre row stay in use
    x = torch.randn(1, 3, 6, 6)
    y = conv(x)
    x2 = x.clone()
    x2[:, :, 4:] += 1.0
    y2 = conv(x2)
    assert y.shape == x.shape[:1] + (5,) + x.shape[2:]
    assert torch.equal(y[:, :, :4], y2[:, :, :4]) and not torch.equal(y[:, :, 4], y2[:, :, 4])


@pytest.mark.parametrize("embedding", ["codebook", "learned"])
@pytest.mark.parametrize("output", ["logits", "code"])
def test_upsampler_is_row_causal(embedding, output):
    model = upsampler(r=2, embedding=embedding, output=output)
    key = "logits" if output == "logits" else "codes"
    ids = grid(4, 4)
    base = model(ids)[key]
    for j in range(4):
        changed = model(perturb_row(ids, j))[key]
        assert torch.equal(changed[:, :, : 2 * j], base[:, :, : 2 * j]), f"row {j} leaked upwards"
        assert not torch.equal(changed[:, :, 2 * j : 2 * j + 2], base[:, :, 2 * j : 2 * j + 2])


@pytest.mark.parametrize("r", [2, 4])
def test_upsampler_shapes(r):
    model = upsampler(r=r, output="both")
    out = model(grid(4, 3))
    assert out["logits"].shape == (2, V, 4 * r, 3 * r)
    assert out["codes"].shape == (2, D, 4 * r, 3 * r)
    ids_high = model.upsample(grid(4, 3))
    assert ids_high.shape == (2, 4 * r, 3 * r) and ids_high.dtype == torch.int64
    assert torch.equal(ids_high, out["logits"].argmax(1))  # 'both' reads tokens off the logits
    assert set(upsampler(r=r, output="logits")(grid(4, 3))) == {"logits"}


def test_code_output_takes_the_tokenizers_nearest_entry():
    vq = tiny_vq()
    model = upsampler(output="code")
    codes = model(grid(4, 4))["codes"]
    ids_high = model.upsample(grid(4, 4))
    assert torch.equal(ids_high, vq.nearest_ids(codes))
    assert torch.equal(nearest_entries(codes, vq.codebook), ids_high)


@pytest.mark.parametrize("r", [2, 4])
@pytest.mark.parametrize("windowed", [False, True])
def test_incremental_rows_equal_whole_grid(r, windowed):
    model = upsampler(r=r)
    assert model.context_rows == 2  # 2 blocks x (3 // 2)
    ids = grid(7, 4, seed=3)
    whole = model.upsample(ids)
    chunks = [(0, 2), (2, 3), (3, 7)]  # the last chunk starts beyond the context window of row 0
    rows = [model.upsample_rows(ids[:, :end], first, windowed=windowed) for first, end in chunks]
    assert [p.shape[1] for p in rows] == [r * (end - first) for first, end in chunks]
    assert torch.equal(torch.cat(rows, dim=1), whole)


def test_non_causal_upsampler_sees_rows_below_and_upsamples_rows_from_the_whole_prefix(tmp_path):
    model = upsampler(r=2, causal=False)
    assert not model.blocks[0].conv.mask.eq(0).any()  # every tap in use
    ids = grid(5, 4, seed=3)
    base = model(ids)["logits"]
    changed = model(perturb_row(ids, 2))["logits"]  # 2 blocks of reach 1: low-res row 0 sees rows 0 .. 2
    assert not torch.equal(changed[:, :, :2], base[:, :, :2])
    for first in range(5):  # windowed or not, the new rows come from the whole prefix given
        for windowed in (False, True):
            assert torch.equal(model.upsample_rows(ids, first, windowed), model.upsample(ids)[:, 2 * first :])
    loaded = Upsampler.from_pretrained(model.save_pretrained(tmp_path / "non_causal")).eval()
    assert loaded.config.causal is False and torch.equal(loaded(ids)["logits"], base)


def test_upsample_rows_rejects_bad_first_row():
    with pytest.raises(
        ValueError, match=r"first_row must lie in \[0, 3\) for a low-res prefix of 3 rows, got 3"
    ):
        upsampler().upsample_rows(grid(3, 4), 3)


@pytest.mark.parametrize("embedding", ["codebook", "learned"])
def test_save_load_round_trip(tmp_path, embedding):
    model = upsampler(embedding=embedding, output="both")
    model.save_pretrained(tmp_path / "up")
    loaded = Upsampler.from_pretrained(tmp_path / "up")
    assert loaded.config == model.config
    assert set(loaded.state_dict()) == set(model.state_dict())
    assert "blocks.0.conv.mask" not in loaded.state_dict()  # the mask follows from the kernel size
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    ids = grid(4, 4)
    assert torch.equal(loaded(ids)["logits"], model(ids)["logits"])
    loaded.check_tokenizer(tiny_vq())  # the stored codebook came back
    with pytest.raises(ValueError, match="holds a 'upsampler' model, not a 'downsampler' model"):
        Downsampler.from_pretrained(tmp_path / "up")

    down = downsampler(r=4, embedding=embedding)
    down.save_pretrained(tmp_path / "down")
    loaded_down = Downsampler.from_pretrained(tmp_path / "down")
    assert torch.equal(loaded_down(grid(8, 8)), down(grid(8, 8)))


@pytest.mark.parametrize("r", [2, 4])
def test_downsampler_shapes(r):
    model = downsampler(r=r)
    logits = model(grid(8, 8))
    assert logits.shape == (2, V, 8 // r, 8 // r)
    ids = model.downsample(grid(8, 8))
    assert ids.shape == (2, 8 // r, 8 // r) and ids.dtype == torch.int64
    assert torch.equal(ids, logits.argmax(1))


def test_downsampler_is_row_causal():
    model = downsampler(r=2)
    ids = grid(8, 8)
    base = model(ids)
    for j in range(8):
        changed = model(perturb_row(ids, j))
        assert torch.equal(changed[:, :, : j // 2], base[:, :, : j // 2]), f"high-res row {j} leaked upwards"
        assert not torch.equal(changed[:, :, j // 2], base[:, :, j // 2])


@pytest.mark.parametrize(
    "call,message",
    [
        (
            lambda: downsampler(r=4)(grid(6, 8)),
            "high-res grid 6x8 is not divisible by the down-sampler's r=4",
        ),
        (lambda: upsampler()(grid(4, 4) + V), rf"ids must lie in \[0, {V}\), got range"),
        (lambda: upsampler()(grid(4, 4).float()), "ids must be an integer tensor"),
        (lambda: upsampler()(grid(4, 4)[0]), r"ids must be \[B, h, w\], got shape \(4, 4\)"),
        (lambda: downsampler()(grid(4, 4) - V), rf"ids_high must lie in \[0, {V}\)"),
        (
            lambda: Upsampler(UpsamplerConfig(r=2, **TINY), torch.zeros(V, D + 1)),
            r"codebook has shape \(32, 5\)",
        ),
        (lambda: UpsamplerConfig(r=2, **{**TINY, "norm": "group"}), "would break row causality"),
        (lambda: UpsamplerConfig(r=2, **{**TINY, "kernel": 4}), "kernel must be odd"),
        (lambda: UpsamplerConfig(r=1, **TINY), "r must be >= 2"),
        (lambda: UpsamplerConfig(r=2, **TINY, output="pixels"), "output must be one of"),
        (lambda: DownsamplerConfig(r=2, **TINY, embedding="onehot"), "embedding must be one of"),
    ],
)
def test_bad_input_is_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("make", [upsampler, downsampler])
def test_check_tokenizer_refuses_other_codebooks(make):
    model = make()
    model.check_tokenizer(tiny_vq())
    with pytest.raises(
        ValueError, match=r"trained for codebook \(32 entries, 4 dims\) but tokenizer has 64 entries, 4"
    ):
        model.check_tokenizer(tiny_vq(codebook_size=64))
    with pytest.raises(ValueError, match=r"\(32 entries, 4 dims\) but tokenizer has 32 entries, 8 dims"):
        model.check_tokenizer(tiny_vq(codebook_embed_dim=8))
    with pytest.raises(ValueError, match="but tokenizer has other vectors of that shape"):
        model.check_tokenizer(tiny_vq(seed=5))


@pytest.mark.parametrize("mode", ["bicubic", "bilinear", "lanczos"])
@pytest.mark.parametrize("r", [2, 4])
def test_pixel_upsampler_shapes(mode, r):
    vq = tiny_vq()
    sampler = PixelUpsampler(vq, r, mode=mode)
    ids = grid(2, 3)
    ids_high = sampler.upsample(ids)
    assert ids_high.shape == (2, 2 * r, 3 * r) and ids_high.dtype == torch.int64
    assert 0 <= ids_high.min() and ids_high.max() < V
    assert torch.equal(sampler.upsample_rows(ids, 1), ids_high[:, r:])


def test_pixel_samplers_match_direct_resizing():
    vq = tiny_vq()
    ids = grid(2, 2)
    images = vq.decode(ids)
    bilinear = torch.nn.functional.interpolate(images, scale_factor=2, mode="bilinear", antialias=True)
    assert torch.equal(PixelUpsampler(vq, 2, mode="bilinear").upsample(ids), vq.encode(bilinear.clamp(-1, 1)))
    ids_high = grid(4, 4)
    area = torch.nn.functional.avg_pool2d(vq.decode(ids_high), 2)
    assert torch.equal(PixelDownsampler(vq, 2).downsample(ids_high), vq.encode(area))


def test_pixel_upsampler_with_sr_model(tmp_path):
    vq = tiny_vq()
    torch.save(nn.Upsample(scale_factor=2, mode="nearest"), tmp_path / "sr.pt")
    sampler = PixelUpsampler(vq, 2, sr_model_path=tmp_path / "sr.pt", trust_pickle=True)  # a pickled module
    ids = grid(2, 2)
    nearest = nn.functional.interpolate(vq.decode(ids), scale_factor=2, mode="nearest")
    assert torch.equal(sampler.upsample(ids), vq.encode(nearest))

    torch.save(nn.Upsample(scale_factor=3), tmp_path / "x3.pt")
    with pytest.raises(ValueError, match=r"turned \(2, 3, 16, 16\) into \(2, 3, 48, 48\), expected"):
        PixelUpsampler(vq, 2, sr_model_path=tmp_path / "x3.pt", trust_pickle=True).upsample(ids)
    torch.save(nn.Conv2d(3, 3, 1).state_dict(), tmp_path / "weights.pt")
    with pytest.raises(ValueError, match="weights.pt: spandrel does not recognise the architecture"):
        PixelUpsampler(vq, 2, sr_model_path=tmp_path / "weights.pt")
    with pytest.raises(FileNotFoundError, match="super-resolution model .*missing.pt not found"):
        PixelUpsampler(vq, 2, sr_model_path=tmp_path / "missing.pt")


def test_pixel_downsampler_shapes_and_errors():
    vq = tiny_vq()
    sampler = PixelDownsampler(vq, 2)
    ids = sampler.downsample(grid(4, 6))
    assert ids.shape == (2, 2, 3) and ids.dtype == torch.int64
    with pytest.raises(ValueError, match="high-res grid 3x6 is not divisible by the down-sampler's r=2"):
        sampler.downsample(grid(3, 6))
    with pytest.raises(ValueError, match=rf"ids must lie in \[0, {V}\)"):
        sampler.downsample(grid(4, 4) + V)
    with pytest.raises(ValueError, match="mode must be one of"):
        PixelUpsampler(vq, 2, mode="nearest")
    sampler.check_tokenizer(vq)
    with pytest.raises(
        ValueError, match="pixel downsampler trained for codebook .* tokenizer has 64 entries"
    ):
        sampler.check_tokenizer(tiny_vq(codebook_size=64))
    with pytest.raises(ValueError, match="pixel upsampler trained for codebook .* other vectors"):
        PixelUpsampler(vq, 2).check_tokenizer(tiny_vq(seed=5))


def test_soft_codes_weights_sum_to_one():
    logits = torch.randn(2, V, 3, 3, requires_grad=True)
    constant = torch.full((V, D), 0.5)
    assert torch.allclose(soft_codes(logits, constant, temperature=0.7), torch.full((2, D, 3, 3), 0.5))
    book = codebook()
    sharp = soft_codes(logits, book, temperature=1e-4)
    assert torch.allclose(sharp, book[logits.argmax(1)].permute(0, 3, 1, 2), atol=1e-5)
    soft_codes(logits, book).sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="temperature must be > 0"):
        soft_codes(logits, book, temperature=0.0)


def test_straight_through_codes_pass_gradient_to_codes():
    book = codebook()
    codes = torch.randn(2, D, 3, 3, requires_grad=True)
    quantised = straight_through_codes(codes, book)
    ids = nearest_entries(codes, book)
    assert torch.allclose(quantised, book[ids].permute(0, 3, 1, 2))
    upstream = torch.randn_like(quantised)
    (quantised * upstream).sum().backward()
    assert torch.allclose(codes.grad, upstream)


@pytest.mark.parametrize("windowed", [False, True])
def test_upsample_rows_logits_are_the_logits_behind_upsample_rows(windowed):
    model = upsampler(r=2)
    ids = grid(7, 4, seed=3)
    for first in (0, 3, 6):  # 3 and 6 start beyond the context window of row 0
        logits = model.upsample_rows_logits(ids, first, windowed=windowed)
        assert logits.shape == (2, V, 2 * (7 - first), 8)  # grid() draws two grids
        assert torch.equal(logits.argmax(1), model.upsample_rows(ids, first, windowed=windowed))
        assert torch.allclose(logits, model(ids)["logits"][:, :, 2 * first :], atol=1e-5)


def test_a_code_only_upsampler_has_no_logits_to_sample_from():
    with pytest.raises(ValueError, match="predicts codes only \\(config.output 'code'\\)"):
        upsampler(output="code").upsample_rows_logits(grid(3, 4), 0)
