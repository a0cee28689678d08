"""The real model sets' shapes and the call schedules of the cost model (mulo_sd/evaluation/cost_model.py
holds the scaling rule): exact AR / ZipAR schedules at a real grid, schedules recorded on the testbed, and
their scaling to a real grid."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from mulo_sd.decoding.methods import decode_zipar
from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.nets.downsampler import DownsamplerConfig
from mulo_sd.nets.eagle_head import EagleHeadConfig
from mulo_sd.nets.gpt import GPT
from mulo_sd.nets.gpt_config import GPTConfig
from mulo_sd.nets.upsampler import UpsamplerConfig
from mulo_sd.pipeline.decode_entry import decode
from mulo_sd.pipeline.model_set import ModelSet, load_model_set
from mulo_sd.pipeline.set_files import set_config
from mulo_sd.testbed.prompts import evaluation_prompts

TESTBED_SIDE = 16  # the testbed target's grid side
TESTBED_ROLES = ("vq", "target", "drafter_r2", "drafter_r4", "drafter_small", "eagle_head")
# (label, method, knobs over RECOMMENDED); MuLo-SD's r picks the real set it is predicted for
METHODS = (
    ("AR", "ar", {}),
    ("ZipAR", "zipar", {}),
    ("LANTERN", "lantern", {}),
    ("EAGLE-2", "eagle2", {}),
    ("MuLo-SD 2x", "mulo", {"r": 2}),
    ("MuLo-SD 4x", "mulo", {"r": 4}),
)
EXACT = ("ar", "zipar")  # schedules computed at the real grid, not scaled
LLAMAGEN_CODE_DIM = 8  # LlamaGen's VQ-16 codebook_embed_dim (16384 codes), which Tar's AR-DTok codes index


@dataclass
class RealSet:
    """The shapes of one real model set: every model a method of the cost model calls."""

    name: str
    target: GPTConfig
    drafter: GPTConfig  # MuLo-SD's, at target grid / r
    r: int
    small_drafter: GPTConfig  # LANTERN's, at the target's grid
    head: EagleHeadConfig  # EAGLE-2's
    upsampler: UpsamplerConfig
    downsampler: DownsamplerConfig
    cfg_scale: float

    @property
    def side(self) -> int:
        return self.target.grid_size[0]

    @property
    def mulo_label(self) -> str:
        return f"MuLo-SD {self.r}x"


def real_sets(size: str = "real") -> list[RealSet]:
    """LlamaGen-XL t2i 512 px (MuLo-SD 2x) and Tar AR-DTok 1024 px (MuLo-SD 4x). size 'tiny': the same
    grids, prefixes and call structure with small widths (2 layers of width 64, 1024 codes, narrow
    samplers), so the whole command runs in seconds on a CPU."""
    if size not in ("real", "tiny"):
        raise ValueError(f"size must be 'real' or 'tiny', got {size!r}")
    tiny = size == "tiny"
    small = dict(dim=768, n_layer=12, n_head=12)  # LlamaGen GPT-B's shape: LANTERN's drafter (assumed)
    shrink = dict(dim=64, n_layer=2, n_head=4, vocab_size=1024, caption_dim=32) if tiny else {}
    codes = 1024 if tiny else 16384
    sampler = dict(width=32, blocks=2) if tiny else {}

    def gpt(preset, resolution, **fields):
        return preset(resolution, **{**fields, **shrink})

    def real_set(name, preset, side, r, up_width, cfg_scale):
        target = gpt(preset, side)
        samplers = {"codebook_size": codes, "code_dim": LLAMAGEN_CODE_DIM, "blocks": 6}
        return RealSet(
            name=name + (" (tiny)" if tiny else ""), target=target, drafter=gpt(preset, 256), r=r,
            small_drafter=gpt(preset, side, **small), head=EagleHeadConfig.for_target(target),
            upsampler=UpsamplerConfig(r=r, **{**samplers, "width": up_width, **sampler}),
            downsampler=DownsamplerConfig(r=r, **{**samplers, "width": 256, **sampler}),
            cfg_scale=cfg_scale,
        )  # fmt: skip

    # sampler widths: conf/experiment/{llamagen,tar}/{up,down}sampler_r*.yaml; guidance: conf/models/*.yaml
    return [
        real_set("LlamaGen-XL 512", GPTConfig.llamagen_t2i_xl, 512, r=2, up_width=256, cfg_scale=7.5),
        real_set("Tar AR-DTok 1024", GPTConfig.tar_ar_dtok, 1024, r=4, up_width=384, cfg_scale=4.0),
    ]


Schedule = list[tuple[str, int]]


def ar_schedule(grid: tuple[int, int]) -> Schedule:
    """AR's exact schedule: the prefix, then h*w - 1 steps of one token (the last token needs no step)."""
    return [("target.start", 0)] + [("target.step", 1)] * (grid[0] * grid[1] - 1)


def zipar_schedule(grid: tuple[int, int], window: int) -> Schedule:
    """ZipAR's exact schedule on `grid`: recorded from `decode_zipar` on a one-layer stand-in GPT of that
    grid (the schedule depends on the grid and the window only)."""
    config = GPTConfig(
        vocab_size=4, grid_size=grid, dim=8, n_layer=1, n_head=2, cond_type="class", cond_len=1,
        num_classes=1, multiple_of=8,
    )  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    result = decode_zipar(GPT(config).eval(), torch.zeros(1, dtype=torch.long), SamplerConfig(), generator,
                          window)  # fmt: skip
    return list(result.stats.calls)


def scale_schedule(method: str, calls: Schedule, s: int, caps: dict[str, int] | None = None) -> Schedule:
    """A testbed schedule of `method` scaled to a grid s times the side (module docstring, rule 3). caps:
    role -> the most tokens one call of it can be fed at the real size (its grid), None: no cap."""
    if method in EXACT:
        raise ValueError(f"'{method}' schedules are exact at the real size (ar_schedule, zipar_schedule)")
    if s < 1:
        raise ValueError(f"the side ratio s must be >= 1, got {s}")
    caps = caps or {}
    area = s * s
    out: Schedule = []
    for kind, tokens in calls:
        role = kind.split(".")[0]
        cap = caps.get(role)

        def capped(n, cap=cap):
            return n if cap is None else min(n, cap)

        if kind.endswith(".start"):
            out.append((kind, tokens))
        elif method in ("lantern", "eagle2"):
            out += [(kind, tokens)] * area
        elif method == "mulo":
            if role == "drafter":
                out += [(kind, capped(tokens * s))] * s
            else:  # target verifications and island steps, up- and down-sampler calls
                out.append((kind, capped(tokens * area)))
        else:
            raise ValueError(f"no scaling rule for method '{method}'")
    return out


def testbed_schedules(prompts: int, methods=METHODS) -> dict[str, list[Schedule]]:
    """Method label -> the recorded schedule of each of the first `prompts` test prompts, decoded on the
    shipped testbed (CPU) one image at a time at RECOMMENDED knobs, with the default set's folders and
    sampler (conf/models/testbed.yaml)."""
    testbed = set_config("testbed")
    model_set = ModelSet.from_config(testbed)
    sampler = SamplerConfig(**testbed["sampler"])
    rs = sorted({knobs["r"] for _, method, knobs in methods if method == "mulo"})
    roles = [*TESTBED_ROLES, *(f"upsampler_r{r}" for r in rs)]
    models = load_model_set(model_set, roles, "cpu")
    captions = [p.caption for p in evaluation_prompts(prompts, split="test")]
    schedules: dict[str, list[Schedule]] = {}
    for label, method, knobs in methods:
        if method in EXACT:
            continue
        schedules[label] = []
        for seed, caption in enumerate(captions):
            result = decode(method, models, [caption], dict(knobs), sampler, seed)
            schedules[label].append(list(result.stats.calls))
    return schedules


def load_schedules(path: str | Path) -> dict[str, list[Schedule]]:
    """Schedules written by `save_schedules`."""
    stored = json.loads(Path(path).read_text())
    return {
        label: [[(kind, int(n)) for kind, n in calls] for calls in per_image]
        for label, per_image in stored.items()
    }


def save_schedules(path: str | Path, schedules: dict[str, list[Schedule]]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(schedules))
