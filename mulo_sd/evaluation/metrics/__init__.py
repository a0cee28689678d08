"""Image-quality metrics for real prompts (docs/real_evaluation.md): FID (`fid.py`) and CLIP score
(`clip_score.py`), both through torchmetrics, over images read from disk (`images.py`)."""
