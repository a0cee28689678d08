"""CLIP score with torchmetrics' CLIPScore (100 x the cosine of CLIP's image and caption embeddings, mean
over the images, floored at 0), the CLIP model and its processor loaded from a local folder in transformers'
`save_pretrained` layout; nothing downloads (docs/real_evaluation.md).

    clip = load_clip("/models/clip-vit-large-patch14")
    score = clip_score(clip, image_paths, captions)
"""

from __future__ import annotations

from pathlib import Path

import torch

from mulo_sd.evaluation.metrics.images import image_batches
from mulo_sd.nets.safe_files import check_pickled_weights

HOW_TO_GET = (
    "save a CLIP model and its processor there on a machine with internet, e.g. "
    "`huggingface-cli download openai/clip-vit-large-patch14 --local-dir <folder>`, or in Python "
    "CLIPModel.from_pretrained(name).save_pretrained(folder) and CLIPProcessor.from_pretrained(name)"
    ".save_pretrained(folder)"
)


def check_clip_folder(folder: str | Path) -> Path:
    """`folder`, after checking that it holds a CLIP config and weights that load without running code
    (mulo_sd/nets/safe_files.py); errors name the folder or file and what to do."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"CLIP model folder not found (no config.json): {folder}; {HOW_TO_GET}")
    check_pickled_weights(folder, "CLIPModel")
    return folder


def load_clip(folder: str | Path, device: str | torch.device = "cpu"):
    """(CLIPModel, CLIPProcessor) from `folder`, local files only."""
    from transformers import CLIPModel, CLIPProcessor

    folder = check_clip_folder(folder)
    model = CLIPModel.from_pretrained(folder, local_files_only=True).to(device).eval()
    # the slow (PIL) image processor: the reference implementation the published CLIP scores used
    processor = CLIPProcessor.from_pretrained(folder, local_files_only=True, use_fast=False)
    return model, processor


@torch.no_grad()
def clip_score(
    clip, paths: list[Path], captions: list[str], batch_size: int = 32, device: str | torch.device = "cpu"
) -> float:
    """CLIP score of the images at `paths` against their `captions` (one per image)."""
    from torchmetrics.multimodal.clip_score import CLIPScore

    if len(paths) != len(captions):
        raise ValueError(f"{len(paths)} images but {len(captions)} captions")
    # rank 0 scores every image itself: no sync with other ranks (which have finished)
    metric = CLIPScore(model_name_or_path=lambda: clip, sync_on_compute=False)
    for n, batch in enumerate(image_batches(list(paths), batch_size)):
        metric.update(list(batch.to(device)), captions[n * batch_size : (n + 1) * batch_size])
    return float(metric.compute())
