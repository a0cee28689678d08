"""`MuLoPipeline`: a model set loaded once, decoding prompts with any method, in the manner of diffusers'
pipelines; `mulo-decode` (training/decode.py) decodes through it.

    pipe = MuLoPipeline.from_pretrained("testbed")  # a set's name, a set file or a testbed-layout folder
    out = pipe(["a red circle on a striped background"], method="mulo", seed=0, tau=0.05)
    out.images[0].save("sample.png")  # out.tokens[0]: its token grid; out.stats[0]: its DecodeStats

The set is read and checked when it is named (mulo_sd/pipeline/set_files.py, ModelSet.from_config); models
load on the first call that needs them, only those its method needs (decode_entry.required_models) with the
roles the condition comes from (the T5 encoder; Tar's MLLM and TA-Tok file), and stay loaded for later calls.
A call that gives the condition itself (`condition=`: e.g. TA-Tok features for Tar's AR-DTok stage) loads no
condition roles. Each prompt decodes alone, a batch of one (the latency speculative decoding shortens), from
a generator seeded with its seed, so its image is the one `mulo-decode prompt=... seed=...` writes whatever
else the list holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from PIL import Image

from mulo_sd.decoding.methods import DecodeResult
from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.decoding.stats import DecodeStats
from mulo_sd.pipeline.decode_entry import PURPOSES, decode, required_models, tensor_to_pil
from mulo_sd.pipeline.model_set import Models, ModelSet, load_model_set
from mulo_sd.pipeline.roles import MLLM, ROLES, TATOK
from mulo_sd.pipeline.set_files import set_config
from mulo_sd.pipeline.tar_decode import decode_tar

Condition = tuple[torch.Tensor, torch.Tensor | None]  # (cond [B, ...], cond_mask [B, L] or None)


@dataclass
class PipelineOutput:
    """One entry per prompt (or per row of the condition), in order."""

    images: list[Image.Image]
    tokens: torch.Tensor  # int64 [B, h, w] on the CPU: each image's VQ token grid
    stats: list[DecodeStats]  # each decode's statistics; on a Tar set, of its AR-DTok stage
    rows: list[dict[str, int | float | str]]  # every statistic by name, as mulo-decode prints them


class MuLoPipeline:
    """A model set with its sampling defaults (`sampler`; Tar's `mllm_sampler`) and knob defaults (`knobs`:
    method -> knobs over decode_entry.RECOMMENDED), decoding on `device`."""

    def __init__(
        self,
        model_set: ModelSet,
        sampler: SamplerConfig | None = None,
        mllm_sampler: SamplerConfig | None = None,
        knobs: Mapping[str, Mapping] | None = None,
        device: str | torch.device | None = None,
    ):
        self.model_set = model_set
        self.sampler = sampler or SamplerConfig()
        self.mllm_sampler = mllm_sampler
        self.knobs = {method: dict(values) for method, values in (knobs or {}).items()}
        self.device = model_set.device if device is None else device
        self.condition_kind = model_set.target_cond_type()  # 'words', 't5' or 'tatok'; reads the target
        self.models: Models | None = None  # what the calls so far loaded
        self._loaded: tuple[list[str], bool] = ([], False)  # (roles asked for, with their condition roles)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path = "testbed",
        *,
        root: str | Path | None = None,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        **folders: str | Path | None,
    ) -> MuLoPipeline:
        """The set named (conf/models/: 'testbed', 'llamagen_t2i_xl_512', 'tar_1024', ...), a set file or a
        folder in the testbed layout. `root`: the folder of the set's model folders (the real sets leave it
        to you); `device`, `dtype`: over the set's; `folders`: role -> folder over the set's (relative ones
        under root; None: the set has none), e.g. drafter_r2="ablation/drafter_r2_from_target"."""
        cfg = set_config(name_or_path)
        if root is not None:
            cfg["root"] = str(root)
        if cfg.get("root") in (None, "", "???"):
            raise ValueError(
                f"model set '{cfg.get('name')}' keeps its models under a folder you give: "
                f"MuLoPipeline.from_pretrained({str(name_or_path)!r}, root='/ckpts')"
            )
        if dtype is not None:
            cfg["dtype"] = str(dtype).removeprefix("torch.")
        given = {role: None if folder is None else str(folder) for role, folder in folders.items()}
        cfg["folders"] = {**(cfg.get("folders") or {}), **given}
        return cls.from_config(cfg, device)

    @classmethod
    def from_config(cls, cfg: Mapping, device: str | torch.device | None = None) -> MuLoPipeline:
        """From a `models` config (conf/models/*.yaml, as Hydra composes it for the entry points)."""
        mllm = cfg.get("mllm_sampler")
        return cls(
            ModelSet.from_config(cfg),
            SamplerConfig(**(cfg.get("sampler") or {})),
            SamplerConfig(**mllm) if mllm else None,
            cfg.get("knobs"),
            device,
        )

    def roles(self, method: str, knobs: Mapping | None = None, condition: bool = False) -> list[str]:
        """The roles a decode with `method` and `knobs` loads, each checked to be in the set (a missing one
        is an error saying how to make it); nothing loads. `condition`: the call gives the condition."""
        names = required_models(method, self.method_knobs(method, knobs))  # checks method and knobs
        if self.condition_kind == "tatok" and not condition:
            names += [MLLM, TATOK]
        for name in names:  # a role the set lacks fails before anything loads
            purpose = PURPOSES.get(name, f"method={method} uses it")
            self.model_set.path(name, purpose)
        return names

    def method_knobs(self, method: str, knobs: Mapping | None = None) -> dict:
        """`knobs` over the set's own for `method` (e.g. tar_1024's MuLo-SD r=4)."""
        return {**self.knobs.get(method, {}), **(knobs or {})}

    def __call__(
        self,
        prompts: str | Sequence[str] | None = None,
        method: str = "mulo",
        seed: int | Sequence[int] = 0,
        *,
        sampler: SamplerConfig | Mapping | None = None,
        condition: torch.Tensor | Condition | None = None,
        compare_ar: bool = False,
        compile: bool | str = False,
        **knobs,
    ) -> PipelineOutput:
        """Decode each prompt with `method` and its `knobs` (decode_entry.method_knobs lists them; unknown
        ones are an error listing them); `seed`: one for all or one per prompt. `sampler`: a SamplerConfig,
        or fields over the set's. `condition`: instead of prompts, what the target is conditioned on, rows
        of a tensor or a (cond, cond_mask) pair (e.g. TA-Tok features [B, N, D] for Tar's AR-DTok stage).
        `compare_ar`: also decode with plain AR and report the method's speedup in `rows`. `compile`: decode
        (AR under compare_ar too) through compiled model steps (mulo_sd/nets/compiled.py; the first decodes
        pay the compilation; "every_width": the first decode of a shape compiles all its step widths)."""
        names = self.roles(method, knobs, condition is not None)
        if self.condition_kind == "tatok" and condition is None and self.mllm_sampler is None:
            name = self.model_set.name
            raise ValueError(f"model set '{name}' has no mllm_sampler, which Tar's MLLM samples with")
        inputs = _inputs(prompts, condition)
        seeds = list(seed) if isinstance(seed, Sequence) else [seed] * len(inputs)
        if len(seeds) != len(inputs):
            raise ValueError(f"{len(seeds)} seeds for {len(inputs)} prompts: give one seed or one per prompt")
        sampler = sampler if isinstance(sampler, SamplerConfig) else replace(self.sampler, **(sampler or {}))
        models = self._load(names, condition is None)
        knobs = self.method_knobs(method, knobs)
        decoded = [
            self._decode(models, method, knobs, sampler, prompt, row, image_seed, compare_ar, compile)
            for (prompt, row), image_seed in zip(inputs, seeds, strict=True)
        ]
        return PipelineOutput(
            images=[tensor_to_pil(result.image[0]) for result, _ in decoded],
            tokens=torch.cat([result.tokens.cpu() for result, _ in decoded]),
            stats=[result.stats for result, _ in decoded],
            rows=[row for _, row in decoded],
        )

    def _load(self, names: list[str], condition_roles: bool) -> Models:
        """The models of `names` (and, with `condition_roles`, the roles their condition comes from): the
        ones loaded before when they hold them, else every role asked for so far, loaded afresh."""
        loaded, with_conditions = self._loaded
        if self.models is None or not set(names) <= set(loaded) or (condition_roles and not with_conditions):
            names = list(dict.fromkeys([*loaded, *names]))
            condition_roles = condition_roles or with_conditions
            self.models = None  # let the old models go before the new ones load
            extra = {} if condition_roles else {"condition_roles": False}
            self.models = load_model_set(self.model_set, names, self.device, **extra)
            self._loaded = (names, condition_roles)
        return self.models

    def _decode(
        self, models, method, knobs, sampler, prompt: str, condition: Condition | None, seed: int, compare_ar,
        compile: bool | str,
    ) -> tuple[DecodeResult, dict]:  # fmt: skip
        """One image and its statistics row."""
        if condition is None and self.condition_kind == "tatok":
            tar = decode_tar(
                method, models, [prompt], knobs, sampler, self.mllm_sampler, seed, compare_ar, compile
            )
            return tar.result, tar.as_dict()
        given = {"compile": compile}
        if condition is not None:  # on the target's device, as Models.condition gives it
            device = models.require("target").device
            given["condition"] = tuple(part if part is None else part.to(device) for part in condition)
        result = decode(method, models, [prompt], knobs, sampler, seed, **given)
        row = result.stats.as_dict()
        if compare_ar:
            reference = decode("ar", models, [prompt], {}, sampler, seed, **given)
            row["ar_wall_s"] = reference.stats.wall_seconds
            row["speedup"] = reference.stats.wall_seconds / result.stats.wall_seconds
        return result, row

    def __repr__(self) -> str:
        loaded = [role for role in ROLES if self.models is not None and self.models.get(role) is not None]
        return f"MuLoPipeline(model_set='{self.model_set.name}', device={self.device!r}, loaded={loaded})"


def _inputs(prompts, condition) -> list[tuple[str, Condition | None]]:
    """(prompt, condition row) per image: the prompts, or the rows of the condition (whose prompt is not
    read)."""
    if condition is None:
        prompts = [prompts] if isinstance(prompts, str) else prompts
        if not prompts or not all(isinstance(p, str) for p in prompts):
            raise ValueError(f"prompts must be a caption or a non-empty list of captions, got {prompts!r}")
        return [(prompt, None) for prompt in prompts]
    if prompts is not None:
        raise ValueError("give prompts or a condition, not both: the condition stands in for the prompts")
    cond, mask = condition if isinstance(condition, tuple) else (condition, None)
    rows = [(cond[i : i + 1], None if mask is None else mask[i : i + 1]) for i in range(len(cond))]
    if not rows:
        raise ValueError("the condition has no rows")
    return [("", row) for row in rows]
