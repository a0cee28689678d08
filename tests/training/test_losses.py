"""Shared training losses: hand-computed GAN values, warm-up start, adaptive weight, PatchGAN shapes and
learning, offline LPIPS (frozen, random-backbone warning, missing-file error, cache loading), token CE."""

import math
import warnings
from pathlib import Path

import lpips as lpips_package
import pytest
import torch
import torch.nn.functional as F
from mulo_sd.training.losses import (
    LPIPS,
    AdversarialLoss,
    PatchDiscriminator,
    adaptive_weight,
    backbone_weights_path,
    hinge_d_loss,
    hinge_g_loss,
    non_saturating_d_loss,
    non_saturating_g_loss,
    pixel_loss,
    token_accuracy,
    token_cross_entropy,
)
from torchvision.models import alexnet


def full(value, shape=(2, 1, 3, 3)):
    return torch.full(shape, float(value))


# ---------------------------------------------------------------- pixel


def test_pixel_losses_by_hand():
    a = torch.zeros(2, 3, 4, 4)
    b = torch.zeros(2, 3, 4, 4)
    b[0] = 0.5  # image 0 off by 0.5 everywhere, image 1 exact
    assert pixel_loss(a, b, "mse").item() == pytest.approx(0.125)
    assert pixel_loss(a, b, "l1").item() == pytest.approx(0.25)
    assert torch.allclose(pixel_loss(a, b, "mse", reduction="per_sample"), torch.tensor([0.25, 0.0]))
    with pytest.raises(ValueError, match="unknown pixel loss kind 'l3'"):
        pixel_loss(a, b, "l3")
    with pytest.raises(ValueError, match="same shape"):
        pixel_loss(a, b[:, :, :2])


# ---------------------------------------------------------------- GAN losses


def test_hinge_values_by_hand():
    assert hinge_d_loss(full(2), full(-2)).item() == 0.0  # both beyond the margin
    assert hinge_d_loss(full(0), full(0)).item() == pytest.approx(1.0)  # 0.5 * (1 + 1)
    assert hinge_d_loss(full(0.5), full(1)).item() == pytest.approx(1.25)  # 0.5 * (0.5 + 2)
    assert hinge_g_loss(full(-3)).item() == pytest.approx(3.0)


def test_non_saturating_values_by_hand():
    log2 = math.log(2.0)
    assert non_saturating_d_loss(full(0), full(0)).item() == pytest.approx(log2)  # 0.5 * (log2 + log2)
    expected = 0.5 * (math.log(1 + math.exp(-1)) + math.log(1 + math.exp(2)))
    assert non_saturating_d_loss(full(1), full(2)).item() == pytest.approx(expected)
    assert non_saturating_g_loss(full(0)).item() == pytest.approx(log2)
    assert non_saturating_g_loss(full(3)).item() == pytest.approx(math.log(1 + math.exp(-3)))
    # softplus form stays finite where log(sigmoid) would underflow
    assert math.isfinite(non_saturating_d_loss(full(-200), full(200)).item())


def small_disc(norm="batch"):
    torch.manual_seed(0)
    return PatchDiscriminator(channels=8, n_layers=3, norm=norm)


@pytest.mark.parametrize("kind", ["hinge", "non_saturating"])
def test_adversarial_terms_zero_before_start(kind):
    adversarial = AdversarialLoss(small_disc(), kind=kind, start=5, weight=0.5)
    real, fake = torch.rand(2, 3, 32, 32) * 2 - 1, torch.rand(2, 3, 32, 32) * 2 - 1
    for step in (0, 4):
        assert not adversarial.active(step)
        g_term, _ = adversarial.generator_loss(fake, step)
        d_loss, _ = adversarial.discriminator_loss(real, fake, step)
        assert g_term.item() == 0.0 and d_loss.item() == 0.0
    assert adversarial.active(5)
    g_term, logs = adversarial.generator_loss(fake, 5)
    d_loss, _ = adversarial.discriminator_loss(real, fake, 5)
    assert g_term.item() != 0.0 and d_loss.item() > 0.0
    assert g_term.item() == pytest.approx(0.5 * logs["g_adv"].item())


def test_adaptive_weight_matches_hand_computation():
    # generator: fake = w * x (one weight); discriminator: logit = mean of the image, so with hinge
    # g_loss = -mean(w x) and rec_loss = mean((w x - y)^2); gradients wrt w by hand.
    x, y = torch.full((1, 1, 2, 2), 2.0), torch.full((1, 1, 2, 2), 1.0)
    w = torch.tensor(3.0, requires_grad=True)
    fake = w * x
    rec_loss = ((fake - y) ** 2).mean()

    class MeanDiscriminator(torch.nn.Module):
        def forward(self, images):
            return images.mean()

    adversarial = AdversarialLoss(MeanDiscriminator(), kind="hinge", weight=0.1, weight_mode="adaptive")
    g_term, logs = adversarial.generator_loss(fake, step=0, rec_loss=rec_loss, last_layer=w)
    rec_grad = 4 * (2 * 3.0 - 1)  # d/dw (2w - 1)^2 = 4(2w - 1) = 20
    g_grad = -2.0  # d/dw -(2w)
    expected_weight = 0.1 * rec_grad / (abs(g_grad) + 1e-4)
    assert logs["adv_weight"].item() == pytest.approx(expected_weight, rel=1e-6)
    assert g_term.item() == pytest.approx(expected_weight * -6.0, rel=1e-6)
    assert not logs["adv_weight"].requires_grad  # detached: the weight itself is not trained
    assert adaptive_weight(rec_loss, -fake.mean(), w).item() == pytest.approx(rec_grad / (2 + 1e-4), rel=1e-6)
    with pytest.raises(ValueError, match="needs rec_loss and last_layer"):
        adversarial.generator_loss(fake, step=0)


def test_adversarial_bad_config_errors():
    with pytest.raises(ValueError, match="unknown adversarial loss kind 'wgan'"):
        AdversarialLoss(small_disc(), kind="wgan")
    with pytest.raises(ValueError, match="unknown adversarial weight mode 'auto'"):
        AdversarialLoss(small_disc(), weight_mode="auto")


@pytest.mark.parametrize("size", [32, 64, 128])
@pytest.mark.parametrize("norm", ["batch", "group"])
def test_discriminator_output_shape(size, norm):
    logits = small_disc(norm)(torch.zeros(2, 3, size, size))
    assert logits.shape == (2, 1, size // 8 - 2, size // 8 - 2)


def test_discriminator_too_small_input_errors():
    with pytest.raises(ValueError, match="at least 24 px"):
        small_disc()(torch.zeros(1, 3, 16, 16))


def test_discriminator_learns_on_fixed_batch():
    disc = small_disc()
    adversarial = AdversarialLoss(disc, kind="hinge")
    torch.manual_seed(1)
    real = torch.rand(4, 3, 32, 32) * 2 - 1
    fake = torch.zeros(4, 3, 32, 32)
    optimizer = torch.optim.Adam(disc.parameters(), lr=1e-3)
    before, _ = adversarial.discriminator_loss(real, fake, step=0)
    before.backward()
    # every weight gets a gradient (the final bias's is exactly 0 while all logits sit inside the margins)
    assert all(p.grad is not None for p in disc.parameters())
    assert all(p.grad.abs().sum() > 0 for name, p in disc.named_parameters() if name.endswith("weight"))
    optimizer.step()
    after, _ = adversarial.discriminator_loss(real, fake, step=0)
    assert after.item() < before.item()


# ---------------------------------------------------------------- LPIPS


@pytest.fixture
def empty_hub(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    if not torch.hub.get_dir().startswith(str(tmp_path)):
        pytest.skip("torch.hub.set_dir was called in this process; TORCH_HOME no longer applies")
    return tmp_path / "hub" / "checkpoints"


def random_lpips(**kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return LPIPS(net="alex", pretrained_backbone=False, **kwargs)


def test_lpips_random_backbone_warns_and_measures():
    with pytest.warns(UserWarning, match="RANDOM alex backbone"):
        metric = LPIPS(net="alex", pretrained_backbone=False)
    assert "random (NOT perceptual)" in metric.describe()
    torch.manual_seed(0)
    a, b = torch.rand(2, 3, 32, 32) * 2 - 1, torch.rand(2, 3, 32, 32) * 2 - 1
    assert metric(a, a).item() == 0.0
    per_sample = metric(a, b, reduction="per_sample")
    assert per_sample.shape == (2,) and (per_sample > 0).all()
    assert metric(a, b).item() == pytest.approx(per_sample.mean().item())


def test_lpips_missing_backbone_names_file(empty_hub):
    with pytest.raises(FileNotFoundError, match="vgg16-397923af.pth") as error:
        LPIPS(net="vgg", pretrained_backbone=True)
    assert str(empty_hub) in str(error.value)
    with pytest.raises(FileNotFoundError, match="alexnet-owt-7be5be79.pth"):
        LPIPS(net="alex", pretrained_backbone=True)


def test_lpips_loads_backbone_from_cache(empty_hub):
    # a stand-in for torchvision's file (features only, to keep the test small)
    torch.manual_seed(3)
    features = {f"features.{k}": v for k, v in alexnet().features.state_dict().items()}
    empty_hub.mkdir(parents=True)
    torch.save(features, backbone_weights_path("alex"))
    metric = LPIPS(net="alex", pretrained_backbone=True)
    assert torch.equal(metric.model.net.slice2.get_submodule("3").weight, features["features.3.weight"])
    assert "alexnet-owt-7be5be79.pth" in metric.describe()


def test_lpips_linear_weights_flag():
    packaged = random_lpips(linear_weights=True).model.lin0.model[1].weight
    shipped_file = Path(lpips_package.__file__).parent / "weights" / "v0.1" / "alex.pth"
    shipped = torch.load(shipped_file, map_location="cpu", weights_only=True)["lin0.model.1.weight"]
    assert torch.equal(packaged, shipped)
    assert not torch.equal(random_lpips(linear_weights=False).model.lin0.model[1].weight, shipped)


def test_lpips_frozen_in_eval_and_out_of_checkpoints():
    parent = torch.nn.Module()
    parent.head = torch.nn.Linear(2, 2)
    parent.lpips = random_lpips()
    parent.train()
    assert parent.head.training
    assert not any(m.training for m in parent.lpips.modules())
    assert not any(p.requires_grad for p in parent.lpips.parameters())
    assert list(parent.state_dict()) == ["head.weight", "head.bias"]
    parent.load_state_dict(parent.state_dict())  # strict load still works
    # gradients reach the images, not the weights
    image = torch.zeros(1, 3, 32, 32, requires_grad=True)
    parent.lpips(image, torch.ones(1, 3, 32, 32)).backward()
    assert image.grad.abs().sum() > 0


# ---------------------------------------------------------------- tokens


def test_token_cross_entropy_matches_flattened():
    torch.manual_seed(0)
    logits = torch.randn(2, 7, 3, 4)
    targets = torch.randint(0, 7, (2, 3, 4))
    flat_logits = logits.permute(0, 2, 3, 1).reshape(-1, 7)
    assert token_cross_entropy(logits, targets).item() == pytest.approx(
        F.cross_entropy(flat_logits, targets.flatten()).item(), rel=1e-6
    )
    assert token_cross_entropy(logits, targets, label_smoothing=0.1).item() == pytest.approx(
        F.cross_entropy(flat_logits, targets.flatten(), label_smoothing=0.1).item(), rel=1e-6
    )
    masked = targets.clone()
    masked[0, 0] = 5
    expected = F.cross_entropy(flat_logits, masked.flatten(), ignore_index=5).item()
    assert token_cross_entropy(logits, masked, ignore_index=5).item() == pytest.approx(expected, rel=1e-6)
    with pytest.raises(ValueError, match=r"logits \[B,V,h,w\] and targets \[B,h,w\]"):
        token_cross_entropy(logits, targets[:, :2])


def test_token_accuracy_by_hand():
    # 1x2x2 grid over 3 tokens; argmax = [[0, 1], [2, 2]]
    logits = torch.zeros(1, 3, 2, 2)
    logits[0, 0, 0, 0] = logits[0, 1, 0, 1] = logits[0, 2, 1, 0] = logits[0, 2, 1, 1] = 1.0
    targets = torch.tensor([[[0, 1], [1, 2]]])
    assert token_accuracy(logits, targets).item() == pytest.approx(0.75)
    assert token_accuracy(logits, targets, ignore_index=1).item() == pytest.approx(1.0)  # 2 of 2 counted
