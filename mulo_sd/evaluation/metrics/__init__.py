"""Image-quality metrics for real prompts (docs/real_evaluation.md): FID (`fid.py`, torchmetrics, with the
resizing protocols of published numbers in `fid_protocols.py`), HPSv2 (`hpsv2.py`, open_clip with a local HPS
checkpoint) and CLIP score (`clip_score.py`, torchmetrics), over images read from disk (`images.py`)."""
