"""Real-ESRGAN's compact super-resolution network (SRVGGNetCompact, Wang et al. 2021), in the published
weight layout, so that its state dict is the file any Real-ESRGAN compact loader reads (spandrel's too:
mulo_sd/nets/sr_network.py):

    body.0      conv 3 -> F, 3x3          body.1      PReLU(F)
    body.2k     conv F -> F, 3x3          body.2k+1   PReLU(F)       k = 1 .. num_conv
    body.2N+2   conv F -> 3 s^2, 3x3      then PixelShuffle(s) + nearest-enlarged input (the residual)

Images in [0, 1], as Real-ESRGAN's. The testbed trains it (training/sr_module.py); decoding never builds it
from this class but from the file, through spandrel, as it would a downloaded one.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class SRVGGNetCompact(nn.Module):
    def __init__(self, num_feat: int = 32, num_conv: int = 8, upscale: int = 2):
        super().__init__()
        self.upscale = upscale
        layers: list[nn.Module] = [nn.Conv2d(3, num_feat, 3, 1, 1), nn.PReLU(num_parameters=num_feat)]
        for _ in range(num_conv):
            layers += [nn.Conv2d(num_feat, num_feat, 3, 1, 1), nn.PReLU(num_parameters=num_feat)]
        layers.append(nn.Conv2d(num_feat, 3 * upscale * upscale, 3, 1, 1))
        self.body = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, 3, H, W] in [0, 1] -> [B, 3, s H, s W]."""
        out = x
        for layer in self.body:
            out = layer(out)
        base = F.interpolate(x, scale_factor=self.upscale, mode="nearest")
        return F.pixel_shuffle(out, self.upscale) + base
