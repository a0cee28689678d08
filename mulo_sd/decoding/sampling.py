"""Sampling shared by every decoding method: classifier-free guidance, temperature, top-k, top-p.

Every method (ar, zipar, lantern, mulo) draws its tokens from `process_logits(...)` of the target's guided
logits and tests acceptance against the same distribution, so a speculative method is compared to plain AR
decoding under exactly the distribution AR sampling would use.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SamplerConfig:
    """How logits become a token distribution. `temperature == 0` is greedy decoding (argmax).

    `top_k == 0` and `top_p == 1` switch those filters off. `cfg_scale` is handed to the model's `start`,
    which applies guidance (`guide`) on its batch-doubled rows; `1.0` means no guidance.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    cfg_scale: float = 1.0

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def process_logits(logits: torch.Tensor, cfg: SamplerConfig) -> torch.Tensor:
    """Guided logits [..., V] -> float32 probabilities [..., V]: temperature, then top-k, then top-p.

    Same order as LlamaGen. Top-k keeps every token whose logit is >= the k-th largest (ties at the boundary
    are kept). Top-p keeps, in descending probability order, the shortest prefix whose mass reaches `top_p`
    (a token is kept when the mass strictly before it is < top_p), measured after top-k.
    Temperature 0 gives a one-hot distribution on the argmax.
    """
    logits = logits.float()
    if cfg.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / cfg.temperature
    if 0 < cfg.top_k < logits.shape[-1]:
        kth_largest = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
        sorted_probs = sorted_logits.softmax(-1)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        drop_sorted = mass_before >= cfg.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Draw one id per distribution: probs [..., V] -> int64 ids [...], using `generator` only."""
    if generator.device.type != probs.device.type:
        raise ValueError(
            f"generator is on {generator.device} but probs are on {probs.device}: "
            f"create it with torch.Generator(device=probs.device)"
        )
    flat = probs.reshape(-1, probs.shape[-1])
    ids = torch.multinomial(flat, 1, generator=generator)
    return ids.reshape(probs.shape[:-1])


def image_generators(generator, batch: int) -> list[torch.Generator]:
    """The generator of every image of a batch: `generator` as a list of `batch` generators (image b draws
    from generator[b] only, as when decoded alone), or one generator shared by all images (then the
    speculative methods decode them one after another, each drawing from it in turn)."""
    if isinstance(generator, torch.Generator):
        return [generator] * batch
    generators = list(generator)
    if len(generators) != batch or not all(isinstance(g, torch.Generator) for g in generators):
        raise ValueError(f"generator must be a torch.Generator or a list of {batch} (one per image)")
    return generators


def per_image(generator) -> bool:
    """Whether `generator` is a list of per-image generators (what batched decoding together needs)."""
    return not isinstance(generator, torch.Generator)


def sample_rows(probs: torch.Tensor, generator) -> torch.Tensor:
    """`sample` for a batch, probs [B, ..., V]: one generator for the whole batch (one draw over every row,
    as `sample`), or a list of B generators, row b drawn from generator[b] exactly as `sample` alone would."""
    if isinstance(generator, torch.Generator):
        return sample(probs, generator)
    generators = image_generators(generator, probs.shape[0])
    return torch.cat([sample(probs[b : b + 1], g) for b, g in enumerate(generators)])
