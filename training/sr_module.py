"""LightningModule that trains the testbed's super-resolution network (Real-ESRGAN's compact architecture,
mulo_sd/nets/sr_network_compact.py) for the pixel-space up-sampler (docs/super_resolution.md).

Input: the low-res render ("image_{image_size/r}", the datamodule's box downscale) VQ-encoded and decoded by
the frozen testbed VQ, which is what the pixel path feeds the network in decoding (it VQ-decodes the
drafter's low-res tokens); target: the high-res render ("image"). Loss: L1 in [0, 1] pixels, plus
`spectrum_weight` times the L1 distance between the amplitude spectra of the two lumas above the texture
statistic's cutoff (`detail_spectrum`): the L1-optimal output for stripes or checks whose phase the blurred
input does not pin down is their mean, flat grey, and the amplitude spectrum does not depend on the phase, so
this term asks for the detail without asking where it lies exactly. Validation:
PSNR of the network and of bicubic against the render, and the texture statistic (mulo_sd/evaluation/
texture.py) of both and of the renders. Export: the state dict alone, as `model.safetensors` in the
published key layout, which spandrel recognises (mulo_sd/nets/sr_network.py loads it back).
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from mulo_sd.training.checkpoints import config_node
from mulo_sd.training.frozen import frozen
from mulo_sd.training.optim import adamw, warmup_cosine_schedule
from mulo_sd.training.vq_module import psnr
from omegaconf import DictConfig
from safetensors.torch import save_file

from mulo_sd.evaluation.texture import CUTOFF, LUMA, radial_frequency, texture
from mulo_sd.nets.sr_network import SR_FILE_NAME
from mulo_sd.nets.sr_network_compact import SRVGGNetCompact
from mulo_sd.nets.vq import VQModel


def detail_spectrum(images: torch.Tensor) -> torch.Tensor:
    """[B, K]: the FFT amplitudes of the Hann-windowed luma of images [B, 3, H, W] in [-1, 1] at the K
    frequencies above the texture statistic's cutoff, over sqrt(H W) (about the detail's RMS); differentiable
    (mulo_sd/evaluation/texture.py computes the statistic itself in float64, without gradients)."""
    height, width = images.shape[-2:]
    luma = torch.einsum("bchw,c->bhw", images, images.new_tensor(LUMA)) / 2
    window = torch.outer(
        torch.hann_window(height, device=images.device), torch.hann_window(width, device=images.device)
    )
    centred = window * (luma - (luma * window).sum((-2, -1), keepdim=True) / window.sum())
    amplitude = torch.fft.fft2(centred).abs() / (height * width) ** 0.5
    return amplitude[:, radial_frequency(height, width).to(images.device) > CUTOFF]


class SRLightning(L.LightningModule):
    def __init__(
        self,
        r: int,
        image_size: int,
        tokenizer: str,
        network: DictConfig,
        optim: DictConfig,
        loss: DictConfig,
    ):
        super().__init__()
        self.save_hyperparameters()
        if image_size % r:
            raise ValueError(f"model.image_size {image_size} is not divisible by model.r={r}")
        self.r, self.high_size, self.low_size = r, image_size, image_size // r
        self.network = SRVGGNetCompact(upscale=r, **config_node(network))
        self.vq = frozen(VQModel.from_pretrained(tokenizer))
        self.optim_cfg = config_node(optim)
        loss = config_node(loss)
        self.l1_weight, self.spectrum_weight = float(loss.l1_weight), float(loss.spectrum_weight)

    def configure_optimizers(self):
        optimizer = adamw(self.network.parameters(), self.optim_cfg)
        schedule = warmup_cosine_schedule(optimizer, self.optim_cfg)
        return [optimizer], [{"scheduler": schedule, "interval": "step"}]

    @torch.no_grad()
    def network_input(self, batch: dict) -> torch.Tensor:
        """The low-res render through the VQ [B, 3, h, w] in [-1, 1]: the decoded draft of decoding."""
        key = f"image_{self.low_size}"
        if key not in batch:
            raise ValueError(f"the batch has no {key!r}: add {self.low_size} to data.extra_sizes")
        images = batch[key].float()
        return self.vq.decode(self.vq.encode(images)).clamp(-1, 1)

    def enlarge(self, low: torch.Tensor) -> torch.Tensor:
        """[-1, 1] in and out, as the pixel up-sampler wraps the [0, 1] network."""
        return self.network((low + 1) / 2) * 2 - 1

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        out = self.enlarge(self.network_input(batch))
        image = batch["image"]
        l1 = (out - image).abs().mean() / 2  # in [0, 1] pixels
        spectrum = (detail_spectrum(out) - detail_spectrum(image)).abs().mean()
        self.log("train/l1", l1, prog_bar=True, batch_size=out.shape[0])
        self.log("train/spectrum", spectrum, batch_size=out.shape[0])
        return self.l1_weight * l1 + self.spectrum_weight * spectrum

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        low, image = self.network_input(batch), batch["image"]
        size = (self.high_size, self.high_size)
        bicubic = F.interpolate(low, size=size, mode="bicubic", align_corners=False, antialias=True)
        outputs = {"sr": self.enlarge(low).clamp(-1, 1), "bicubic": bicubic.clamp(-1, 1)}
        n = image.shape[0]
        for name, out in outputs.items():
            self.log(f"val/psnr_{name}", psnr(out, image).mean(), batch_size=n)
            self.log(f"val/texture_{name}", texture(out).mean().float(), batch_size=n)
        self.log("val/texture_render", texture(image).mean().float(), batch_size=n)

    def export(self, folder: Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().float().contiguous().cpu() for k, v in self.network.state_dict().items()}
        save_file(state, folder / SR_FILE_NAME)
        return folder
