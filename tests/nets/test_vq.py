import pytest
import torch

from mulo_sd.nets import VQConfig, VQModel

TINY = dict(
    codebook_size=256,
    codebook_embed_dim=8,
    encoder_ch_mult=[1, 2, 2, 4],
    decoder_ch_mult=[1, 2, 2, 4],
    z_channels=16,
    ch=16,
    num_res_blocks=1,
    norm_groups=8,
)

# Keys and shapes of LlamaGen's VQ_16 (codebook 16384 x 8), read off FoundationVision/LlamaGen
# tokenizer/tokenizer_image/vq_model.py and checked against an instance of that code.
OFFICIAL_VQ16_SHAPES = {
    "quantize.embedding.weight": (16384, 8),
    "quantize.codebook_used": (65536,),
    "quant_conv.weight": (8, 256, 1, 1),
    "post_quant_conv.weight": (256, 8, 1, 1),
    "encoder.conv_in.weight": (128, 3, 3, 3),
    "encoder.conv_blocks.0.res.0.conv1.weight": (128, 128, 3, 3),
    "encoder.conv_blocks.0.downsample.conv.weight": (128, 128, 3, 3),
    "encoder.conv_blocks.2.res.0.nin_shortcut.weight": (256, 128, 1, 1),
    "encoder.conv_blocks.4.attn.1.q.weight": (512, 512, 1, 1),
    "encoder.mid.1.proj_out.weight": (512, 512, 1, 1),
    "encoder.norm_out.weight": (512,),
    "encoder.conv_out.weight": (256, 512, 3, 3),
    "decoder.conv_in.weight": (512, 256, 3, 3),
    "decoder.mid.2.conv2.weight": (512, 512, 3, 3),
    "decoder.conv_blocks.0.attn.2.k.weight": (512, 512, 1, 1),
    "decoder.conv_blocks.1.res.0.nin_shortcut.weight": (256, 512, 1, 1),
    "decoder.conv_blocks.3.upsample.conv.weight": (128, 128, 3, 3),
    "decoder.conv_blocks.4.res.2.conv2.weight": (128, 128, 3, 3),
    "decoder.norm_out.weight": (128,),
    "decoder.conv_out.weight": (3, 128, 3, 3),
}


def tiny(**overrides) -> VQModel:
    torch.manual_seed(0)
    return VQModel(VQConfig(**{**TINY, **overrides})).eval()


def images(size: int, batch: int = 2) -> torch.Tensor:
    return torch.rand(batch, 3, size, size, generator=torch.Generator().manual_seed(size)) * 2 - 1


@pytest.mark.parametrize("size,grid", [(32, 4), (64, 8), (128, 16)])
def test_encode_decode_shapes(size, grid):
    vq = tiny()
    ids = vq.encode(images(size))
    assert vq.downsample_factor == 8
    assert ids.shape == (2, grid, grid) and ids.dtype == torch.int64
    assert 0 <= ids.min() and ids.max() < vq.codebook_size
    out = vq.decode(ids)
    assert out.shape == (2, 3, size, size)
    assert out.min() >= -1 and out.max() <= 1
    assert vq.decode_codes(vq.lookup(ids)).shape == (2, 3, size, size)


def test_codebook_unit_norm_only_with_l2():
    vq = tiny()
    assert vq.codebook.shape == (256, 8)
    torch.testing.assert_close(vq.codebook.norm(dim=1), torch.ones(256))
    plain = tiny(codebook_l2_norm=False)
    assert torch.equal(plain.codebook, plain.quantize.embedding.weight)
    assert plain.codebook.norm(dim=1).max() < 0.1  # LlamaGen's init: uniform in +-1/V


def test_encode_lookup_and_nearest_ids_agree():
    vq = tiny()
    x = images(32)
    z = vq.continuous_codes(x)
    codes, ids, _ = vq.quantize_codes(z)
    assert torch.equal(ids, vq.encode(x))
    torch.testing.assert_close(codes, vq.lookup(ids))
    assert torch.equal(vq.nearest_ids(codes), ids)
    assert torch.equal(vq.nearest_ids(z), ids)
    torch.testing.assert_close(vq.codebook[ids[0, 1, 2]], codes[0, :, 1, 2])


def test_straight_through_gradient_reaches_encoder():
    vq = tiny().train()
    recon, losses = vq(images(32))
    recon.square().mean().backward()
    assert vq.encoder.conv_in.weight.grad.abs().sum() > 0

    vq.zero_grad()
    codes, _, losses = vq.quantize_codes(vq.continuous_codes(images(32)))
    vq.decode_codes(codes).mean().backward()
    assert vq.encoder.conv_in.weight.grad.abs().sum() > 0
    assert vq.quantize.embedding.weight.grad is None  # pixels reach the encoder, not the codebook

    vq.zero_grad()
    losses["codebook"].backward()
    assert vq.quantize.embedding.weight.grad.abs().sum() > 0


def test_vq_losses():
    vq = tiny(commit_loss_beta=0.5)
    z = vq.continuous_codes(images(32))
    codes, _, losses = vq.quantize_codes(z)
    assert set(losses) == {"codebook", "commit", "entropy"}
    distance = (codes - torch.nn.functional.normalize(z, dim=1)).square().mean()
    torch.testing.assert_close(losses["codebook"], distance)
    torch.testing.assert_close(losses["commit"], 0.5 * distance)
    assert losses["entropy"] == 0
    _, _, with_entropy = tiny(entropy_loss_ratio=0.1).quantize_codes(z)
    assert with_entropy["entropy"] != 0


def test_codebook_usage_tracked_in_training_only():
    vq = tiny()
    assert vq.codebook_usage() == 0
    vq.encode(images(32))
    vq(images(32))
    assert vq.codebook_usage() == 0
    vq.train()
    _, ids, _ = vq.quantize_codes(vq.continuous_codes(images(32)))
    assert vq.codebook_usage() == pytest.approx(ids.unique().numel() / 256)
    with pytest.raises(ValueError, match="codebook_show_usage=True"):
        tiny(codebook_show_usage=False).codebook_usage()
    assert "quantize.codebook_used" not in tiny(codebook_show_usage=False).state_dict()


def test_save_and_load_round_trip(tmp_path):
    vq = tiny()
    vq.save_pretrained(tmp_path / "vq")
    loaded = VQModel.from_pretrained(tmp_path / "vq")
    assert loaded.config == vq.config
    x = images(64)
    ids = vq.encode(x)
    assert torch.equal(loaded.encode(x), ids)
    assert torch.equal(loaded.decode(ids), vq.decode(ids))


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda vq: vq.encode(images(36)), "image size 36x36 is not divisible by the downsample factor 8"),
        (lambda vq: vq.encode(torch.zeros(1, 1, 32, 32)), r"images must be \[B, 3, H, W\]"),
        (lambda vq: vq.encode(torch.zeros(3, 32, 32)), r"images must be \[B, 3, H, W\]"),
        (lambda vq: vq.decode(torch.full((1, 2, 2), 256)), r"ids must lie in \[0, 256\)"),
        (lambda vq: vq.decode(torch.full((1, 2, 2), -1)), r"ids must lie in \[0, 256\)"),
        (lambda vq: vq.decode(torch.zeros(1, 2, 2)), "ids must be an integer tensor"),
        (lambda vq: vq.decode(torch.zeros(4, 4, dtype=torch.long)), r"ids must be \[B, h, w\]"),
        (lambda vq: vq.decode_codes(torch.zeros(1, 4, 2, 2)), r"codes must be \[B, 8, h, w\]"),
        (lambda vq: vq.nearest_ids(torch.zeros(1, 8, 2)), r"codes must be \[B, 8, h, w\]"),
    ],
)
def test_bad_input_is_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call(tiny())


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="must be non-empty and of equal length"):
        VQConfig(**{**TINY, "decoder_ch_mult": [1, 2, 4]})
    with pytest.raises(ValueError, match=r"norm_groups=32 must divide every channel count"):
        VQConfig(**{**TINY, "norm_groups": 32})


def test_presets_match_llamagen_layout():
    with torch.device("meta"):  # shapes only: no 70M-parameter allocation
        vq16 = VQModel(VQConfig.llamagen_ds16())
        vq8 = VQModel(VQConfig.llamagen_ds8())
    shapes = {k: tuple(v.shape) for k, v in vq16.state_dict().items()}
    assert {k: shapes.get(k) for k in OFFICIAL_VQ16_SHAPES} == OFFICIAL_VQ16_SHAPES
    assert "decoder.conv_blocks.4.upsample.conv.weight" not in shapes  # the top level does not resample
    assert "encoder.conv_blocks.3.attn.0.q.weight" not in shapes  # attention only at the lowest level
    # counts from instances of LlamaGen's VQ_16 / VQ_8 (the paper quotes 72M parameters for VQ-16)
    assert len(shapes) == 344 and len(vq8.state_dict()) == 300
    assert sum(p.numel() for p in vq16.parameters()) == 71_883_403
    assert (vq16.downsample_factor, vq8.downsample_factor) == (16, 8)
