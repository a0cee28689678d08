"""The harness's quality scores (docs/evaluation.md section 4): per decode the target's NLL of its tokens
and its SceneEval scores; per reported split the reference rows, what the real held-out images, their
tokenizer round trips and AR under other seeds score.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mulo_sd.evaluation.summaries import sceneeval_summary
from mulo_sd.evaluation.texture import texture_summary, with_texture
from mulo_sd.testbed.prompts import Prompt
from mulo_sd.testbed.scene_checks import check_results, kind_scores, prompt_scores
from mulo_sd.testbed.sceneeval import frechet_distance, scene_features

OTHER_SEEDS = "AR (other seeds)"


@torch.inference_mode()
def token_nll(
    target, tokens: torch.Tensor, cond: torch.Tensor, cond_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Mean NLL [B] of grids tokens [B, h, w] under the target, teacher-forced with condition `cond` (and
    its mask, for T5 features: Models.condition)."""
    tokens = tokens.reshape(tokens.shape[0], -1).to(target.device)
    keep = torch.zeros(tokens.shape[0], dtype=torch.bool, device=target.device)
    logits = target(tokens, cond, cond_mask, drop=keep)
    return F.cross_entropy(logits.float().transpose(1, 2), tokens, reduction="none").mean(1).cpu()


def sceneeval_rows(scorer, images: torch.Tensor, captions: list[str]) -> list[dict]:
    """Per image: `sceneeval` (its prompt score) and `sceneeval_<kind>` for each kind its caption states;
    `sceneeval_background` (beside the score, not in it) where the scorer has a background head."""
    backgrounds = scorer.predict_background(images) if scorer.config.background_channels else None
    results = check_results(*scorer.predict(images), captions, backgrounds=backgrounds)
    return [
        {"sceneeval": float(total)} | {f"sceneeval_{kind}": value for kind, value in kinds.items()}
        for total, kinds in zip(prompt_scores(results), kind_scores(results), strict=True)
    ]


@torch.no_grad()
def reference_quality(
    scorer, tokenizer, prompts: list[Prompt], real_features: torch.Tensor, other: tuple | None = None
) -> list[dict]:
    """SceneEval and texture of the prompts' real held-out images and of their tokenizer round trips (encode,
    decode): what a perfect target would score, and the most any method can score through this tokenizer.
    real_features: `scene_features` of the real images, which the runs' FD already needed. `other`: (the
    sceneeval and texture rows of AR's decodes under the fd_ar seeds, their features, the AR run's
    features) adds the row "AR (other seeds)" and every row's fd_ar (FD to those decodes; that row's own: to
    the AR run)."""
    real = torch.stack([p.image for p in prompts]).to(next(tokenizer.parameters()).device)
    round_trip = tokenizer.decode(tokenizer.encode(real)).clamp(-1, 1)
    captions = [p.caption for p in prompts]
    entries = []
    references = (
        ("real images", with_texture(sceneeval_rows(scorer, real, captions), real), real_features),
        (
            "tokenizer round trip",
            with_texture(sceneeval_rows(scorer, round_trip, captions), round_trip),
            scene_features(scorer, round_trip),
        ),
    )
    if other is not None:
        references += ((OTHER_SEEDS, other[0], other[1]),)
    for label, rows, features in references:
        entry = {"label": label, "images": len(rows), **sceneeval_summary(rows), **texture_summary(rows)}
        entry["fd"] = frechet_distance(real_features, features)
        if other is not None:
            entry["fd_ar"] = frechet_distance(other[2] if label == OTHER_SEEDS else other[1], features)
        entries.append(entry)
    return entries
