"""Super-resolution networks from published weight files (mulo_sd/nets/sr_network.py): each architecture's
key layout loads through spandrel and enlarges r times; pickled modules need the trust option; bad files are
errors naming the file."""

import importlib

import pytest
import torch
import torch.nn as nn
from safetensors.torch import save_file

from mulo_sd.nets.pixel_samplers import PixelUpsampler
from mulo_sd.nets.safe_files import UnsafePickleError
from mulo_sd.nets.sr_network import SRNetwork
from mulo_sd.nets.sr_network_compact import SRVGGNetCompact
from tests import helpers


def compact_state(scale: int) -> dict:
    torch.manual_seed(scale)
    return SRVGGNetCompact(num_feat=8, num_conv=2, upscale=scale).state_dict()


def rrdb_state(in_channels: int, feat: int = 8, grow: int = 32) -> dict:
    """Real-ESRGAN's RRDBNet layout (RealESRGAN_x4plus.pth: 3 input channels; x2plus: 12, the pixel-
    unshuffled image), one block; spandrel reads the growth channels as 32, the published value."""
    generator, state = torch.Generator().manual_seed(0), {}

    def conv(name: str, out: int, inp: int) -> None:
        state[f"{name}.weight"] = torch.randn(out, inp, 3, 3, generator=generator) * 0.05
        state[f"{name}.bias"] = torch.zeros(out)

    conv("conv_first", feat, in_channels)
    for k in (1, 2, 3):
        for c in range(1, 6):
            conv(f"body.0.rdb{k}.conv{c}", feat if c == 5 else grow, feat + (c - 1) * grow)
    for name in ("conv_body", "conv_up1", "conv_up2", "conv_hr"):
        conv(name, feat, feat)
    conv("conv_last", 3, feat)
    return state


def swinir_state() -> dict:
    """A tiny SwinIR in the published layout (spandrel's copy of the reference implementation)."""
    swinir = importlib.import_module("spandrel.architectures.SwinIR.__arch.SwinIR").SwinIR
    torch.manual_seed(0)
    model = swinir(
        upscale=2, img_size=16, window_size=4, embed_dim=12, depths=[1], num_heads=[2], mlp_ratio=1.0,
        upsampler="pixelshuffledirect",
    )  # fmt: skip
    return model.state_dict()


@pytest.mark.parametrize(
    ("name", "state", "scale", "architecture"),
    [
        ("compact_x2.safetensors", compact_state(2), 2, "RealESRGAN Compact"),
        ("RealESRGAN_x4plus.pth", rrdb_state(3), 4, "ESRGAN"),
        ("RealESRGAN_x2plus.pth", rrdb_state(12), 2, "ESRGAN"),
        ("swinir_x2.pth", swinir_state(), 2, "SwinIR"),
    ],
)
def test_published_layouts_load_and_enlarge(tmp_path, name, state, scale, architecture):
    path = tmp_path / name
    save_file(state, path) if path.suffix == ".safetensors" else torch.save(state, path)
    network = SRNetwork(path, scale)
    assert (network.architecture, network.scale, network.resized_from) == (architecture, scale, None)
    images = torch.rand(2, 3, 12, 20) * 2 - 1
    out = network(images)
    assert out.shape == (2, 3, 12 * scale, 20 * scale) and out.dtype == torch.float32
    assert out.min() >= -1 and out.max() <= 1


def test_compact_file_runs_our_network(tmp_path):
    """spandrel builds the same network from the file as the testbed trains (sr_network_compact.py)."""
    torch.manual_seed(0)
    ours = SRVGGNetCompact(num_feat=8, num_conv=2, upscale=2).eval()
    save_file(ours.state_dict(), tmp_path / "model.safetensors")
    images = torch.rand(1, 3, 8, 8) * 2 - 1
    expected = (ours((images + 1) / 2).clamp(0, 1) * 2 - 1).detach()
    assert torch.allclose(SRNetwork(tmp_path, 2)(images), expected, atol=1e-6)  # the folder's one file


def test_scale_mismatch_resizes_and_says_so(tmp_path):
    save_file(compact_state(4), tmp_path / "x4.safetensors")
    network = SRNetwork(tmp_path / "x4.safetensors", 2)
    assert network.resized_from == 4
    assert "resized x4 -> x2 with bicubic" in network.describe()
    assert network(torch.zeros(1, 3, 8, 6)).shape == (1, 3, 16, 12)


def test_pixel_upsampler_with_a_state_dict(tmp_path):
    vq = helpers.tiny_vq(0, 32, (1, 2, 2, 4), z_channels=16, ch=16, norm_groups=8)
    save_file(compact_state(2), tmp_path / "model.safetensors")
    sampler = PixelUpsampler(vq, 2, sr_model_path=tmp_path)
    ids = torch.randint(0, 32, (2, 2, 3), generator=torch.Generator().manual_seed(0))
    enlarged = SRNetwork(tmp_path, 2)(vq.decode(ids))
    assert torch.equal(sampler.upsample(ids), vq.encode(enlarged.clamp(-1, 1)))


def test_pickled_module_needs_trust(tmp_path):
    path = tmp_path / "whole.pth"
    torch.save(nn.Upsample(scale_factor=2, mode="nearest"), path)
    with pytest.raises(UnsafePickleError, match=r"whole.pth needs .*Upsample.*pass trust_pickle=True"):
        SRNetwork(path, 2)
    assert SRNetwork(path, 2, trust_pickle=True)(torch.zeros(1, 3, 4, 4)).shape == (1, 3, 8, 8)


def test_bad_files_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"super-resolution model .*missing.pth not found"):
        SRNetwork(tmp_path / "missing.pth", 2)
    torch.save(nn.Conv2d(3, 3, 1).state_dict(), tmp_path / "conv.pth")
    with pytest.raises(ValueError, match=r"conv.pth: spandrel does not recognise the architecture"):
        SRNetwork(tmp_path / "conv.pth", 2)
    torch.save([1, 2], tmp_path / "list.pth")
    with pytest.raises(ValueError, match=r"list.pth holds a list, not a state dict"):
        SRNetwork(tmp_path / "list.pth", 2)
    found = r"expected one weight file .*found \['conv.pth', 'list.pth'\]"
    with pytest.raises(FileNotFoundError, match=found):
        SRNetwork(tmp_path, 2)


def test_model_set_names_the_network(tmp_path):
    from mulo_sd.pipeline.decode_entry import pixel_upsampler, resolve_knobs
    from mulo_sd.pipeline.model_set import Models, ModelSet

    vq = helpers.tiny_vq(0, 32, (1, 2, 2, 4), z_channels=16, ch=16, norm_groups=8)
    save_file(compact_state(2), tmp_path / "RealESRGAN_compact_x2.safetensors")
    folders = {"sr_x2": tmp_path / "RealESRGAN_compact_x2.safetensors", "sr_x4": None}
    models = Models(tokenizer=vq, model_set=ModelSet(name="mine", folders=folders, family="llamagen"))
    upsampler = pixel_upsampler(models, 2, "sr")
    assert upsampler.sr_model.architecture == "RealESRGAN Compact"
    assert pixel_upsampler(models, 2, "sr") is upsampler  # loaded once
    with pytest.raises(FileNotFoundError, match=r"set 'mine' has no sr_x4 folder \(knobs.pixel_mode=sr"):
        pixel_upsampler(models, 4, "sr")
    with pytest.raises(ValueError, match=r"knob pixel_mode must be one of \('bicubic', .*'sr'\), got 'srr'"):
        resolve_knobs("mulo", {"upsampler": "pixel", "pixel_mode": "srr"})
