"""HPSv2 (Human Preference Score v2, tgxs002/HPSv2) with open_clip and a local HPS checkpoint file; nothing
downloads (docs/real_evaluation.md).

    hps = load_hps("/models/HPS_v2.1_compressed.pt")
    scores = hps_scores(hps, image_paths, prompts)      # one score per image; the run's HPSv2 is their mean

What the hpsv2 package does (hpsv2/img_score.py), done here the same way:
- the model: open_clip's ViT-H-14 built without pretrained weights, then the checkpoint's `state_dict`
  loaded into it (the published HPS_v2_compressed.pt / HPS_v2.1_compressed.pt hold {'state_dict': ...});
- the tokenizer: open_clip's for ViT-H-14, its SimpleTokenizer with the BPE vocabulary open_clip ships;
- the image: RGB, to a tensor, its longest side resized to 224 (bicubic on the tensor) and padded to a
  square with 0 (HPS's `ResizeMaxSize`, its "light augmentation" validation transform), then normalised
  with the model's mean and std;
- the score: the cosine of the L2-normalised image and text features (the diagonal of image @ text.T).
hpsv2 runs under CUDA autocast; this runs in the model's own precision (float32), so scores can differ from
the package's in the third decimal.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from mulo_sd.nets.safe_files import load_torch_file

HPS_FILES = {"v2.0": "HPS_v2_compressed.pt", "v2.1": "HPS_v2.1_compressed.pt"}
HPS_MODEL = "ViT-H-14"  # the open_clip model HPS v2 and v2.1 fine-tune
HOW_TO_GET = (
    "download HPS_v2.1_compressed.pt (or HPS_v2_compressed.pt for HPS v2.0) from the Hugging Face repository "
    "xswu/HPSv2 on a machine with internet, e.g. `huggingface-cli download xswu/HPSv2 HPS_v2.1_compressed.pt "
    "--local-dir /models`, and pass its path as hps.checkpoint=<path>; nothing is downloaded at run time"
)


@dataclass
class HPSModel:
    model: torch.nn.Module  # an open_clip CLIP with HPS's weights
    tokenizer: object  # open_clip's tokenizer of the model
    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    source: Path


def check_hps_file(path: str | Path) -> Path:
    """`path`, after checking that the HPS checkpoint exists (the error names it and where to get it)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"HPSv2 checkpoint not found: {path}. Put an HPS checkpoint there: {HOW_TO_GET}"
        )
    return path


def load_hps(path: str | Path, model_name: str = HPS_MODEL, device: str | torch.device = "cpu") -> HPSModel:
    """The HPS scorer: open_clip's `model_name` (one of its model configs, or the path of a model config
    `.json` of one's own, registered under its stem; no pretrained weights) with the `state_dict` of the
    checkpoint at `path`, read with weights_only (a file that needs more is refused)."""
    import open_clip

    path = check_hps_file(path)
    if str(model_name).endswith(".json"):
        config = Path(model_name)
        if not config.is_file():
            raise FileNotFoundError(f"open_clip model config not found: {config} (hps.model)")
        open_clip.add_model_config(config)
        model_name = config.stem
    checkpoint = load_torch_file(path)
    state = checkpoint.get("state_dict") if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict):
        found = sorted(checkpoint) if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise ValueError(f"{path}: an HPS checkpoint holds {{'state_dict': ...}}, found {found}")
    model = open_clip.create_model(model_name, pretrained=None, device="cpu")
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        raise ValueError(f"{path} does not fit open_clip's {model_name}: {str(error)[:300]}") from None
    visual = model.visual
    size = visual.image_size[0] if isinstance(visual.image_size, tuple) else visual.image_size
    mean = tuple(getattr(visual, "image_mean", None) or open_clip.OPENAI_DATASET_MEAN)
    std = tuple(getattr(visual, "image_std", None) or open_clip.OPENAI_DATASET_STD)
    tokenizer = open_clip.get_tokenizer(model_name)
    return HPSModel(model.to(device).eval(), tokenizer, int(size), mean, std, path)


def hps_image(path: str | Path, hps: HPSModel) -> torch.Tensor:
    """float32 [3, S, S]: HPS's validation transform of the image at `path`, with the torchvision calls
    its transform makes (module docstring)."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as TF

    with Image.open(path) as image:
        pixels = TF.to_tensor(image.convert("RGB"))
    height, width = pixels.shape[1:]
    scale = hps.image_size / max(height, width)
    if scale != 1.0:
        new = (round(height * scale), round(width * scale))
        pixels = TF.resize(pixels, list(new), InterpolationMode.BICUBIC)
        pad_h, pad_w = hps.image_size - new[0], hps.image_size - new[1]
        pixels = TF.pad(pixels, [pad_w // 2, pad_h // 2, pad_w - pad_w // 2, pad_h - pad_h // 2], fill=0)
    return TF.normalize(pixels, list(hps.mean), list(hps.std))


@torch.no_grad()
def hps_scores(
    hps: HPSModel, paths: list[Path], prompts: list[str], batch_size: int = 32,
    device: str | torch.device = "cpu",
) -> list[float]:  # fmt: skip
    """HPSv2 score of each image at `paths` against its prompt (one per image)."""
    if len(paths) != len(prompts):
        raise ValueError(f"{len(paths)} images but {len(prompts)} prompts")
    scores = []
    for start in range(0, len(paths), batch_size):
        images = torch.stack([hps_image(path, hps) for path in paths[start : start + batch_size]])
        text = hps.tokenizer(prompts[start : start + batch_size])
        image_features = hps.model.encode_image(images.to(device), normalize=True)
        text_features = hps.model.encode_text(text.to(device), normalize=True)
        scores += (image_features * text_features).sum(-1).float().cpu().tolist()
    return scores
