"""Stand-ins for the files a user brings to a real-prompt evaluation, written the way the user's would be:
a feature extractor as a torch.export `.pt2` file (for the FID Inception), a tiny CLIP in transformers'
save_pretrained layout, and prompt files of every format (docs/real_evaluation.md)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from mulo_sd.testbed.synthscenes import render_scene

COLOURS = {
    "red": (230, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 230), "yellow": (240, 230, 40),
    "purple": (140, 30, 180), "orange": (250, 140, 20), "pink": (250, 150, 200), "cyan": (40, 220, 230),
}  # fmt: skip


class TinyExtractor(nn.Module):
    """Stands in for the FID Inception: uint8 images [N, 3, H, W] -> 8 features."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.conv(images.float() / 127.5 - 1)).mean((2, 3))


_exported: list[bytes] = []  # torch.export's first call costs seconds: export once per test session


def save_tiny_extractor(path: Path) -> Path:
    """A TinyExtractor (seed 0) saved with torch.export, as a user's own extractor would be."""
    if not _exported:
        torch.manual_seed(0)
        example = torch.zeros(2, 3, 16, 16, dtype=torch.uint8)
        dynamic = torch.export.Dim.DYNAMIC  # any batch size and image size, as the FID Inception takes
        shapes = ({0: dynamic, 2: dynamic, 3: dynamic},)
        program = torch.export.export(TinyExtractor().eval(), (example,), dynamic_shapes=shapes)
        torch.export.save(program, path)
        _exported.append(path.read_bytes())
    path.write_bytes(_exported[0])
    return path


def colour_images(size: int = 16) -> dict[str, torch.Tensor]:
    """One uint8 [3, size, size] image per colour: the colour with a darker square in the middle."""
    images = {}
    for name, rgb in COLOURS.items():
        image = torch.tensor(rgb, dtype=torch.uint8)[:, None, None].repeat(1, size, size)
        image[:, size // 4 : -size // 4, size // 4 : -size // 4] //= 2
        images[name] = image
    return images


def save_tiny_clip(folder: Path, steps: int = 80) -> Path:
    """A tiny CLIP (character tokens, 16 px images) trained for a moment to pair each colour image with
    "a photo of a <colour> square", saved with save_pretrained (model and processor)."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer
    from transformers.models.clip.tokenization_clip import bytes_to_unicode

    folder.mkdir(parents=True, exist_ok=True)
    characters = list(bytes_to_unicode().values())
    vocab = characters + [c + "</w>" for c in characters] + ["<|startoftext|>", "<|endoftext|>"]
    (folder / "vocab.json").write_text(json.dumps({token: i for i, token in enumerate(vocab)}))
    (folder / "merges.txt").write_text("#version: 0.2\n")  # no merges: every character is a token
    tokenizer = CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
    size = {"shortest_edge": 16}
    processor = CLIPProcessor(
        image_processor=CLIPImageProcessor(size=size, crop_size={"height": 16, "width": 16}),
        tokenizer=tokenizer,
    )
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    torch.manual_seed(0)
    layers = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    config = CLIPConfig(
        text_config=dict(vocab_size=len(vocab), max_position_embeddings=77, eos_token_id=eos,
                         pad_token_id=eos, bos_token_id=eos - 1, **layers),
        vision_config=dict(image_size=16, patch_size=8, **layers),
        projection_dim=16,
    )  # fmt: skip
    model = CLIPModel(config)
    images = colour_images()
    inputs = processor(
        text=[f"a photo of a {c} square" for c in images], images=list(images.values()), return_tensors="pt",
        padding=True,
    )  # fmt: skip
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        loss = model(**inputs, return_loss=True).loss
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def synthscenes_captions(count: int, seed: int = 3) -> list[str]:
    """Captions the testbed models can condition on (their closed vocabulary)."""
    return [render_scene(seed, i, 16)[1] for i in range(count)]


def write_prompt_files(folder: Path, captions: list[str], image_size: int = 24) -> dict[str, dict]:
    """One prompt file per format with these captions, and the coco / mjhq image folders: format ->
    {file, images} (the arguments of load_prompt_set)."""
    folder.mkdir(parents=True, exist_ok=True)
    coco_images, mjhq_images = folder / "val2017", folder / "mjhq_imgs"
    images, annotations, meta = [], [], {}
    for i, caption in enumerate(captions):
        image_id = 1000 - 7 * i  # ids out of file order: the prompts follow the ids
        picture = render_scene(3, i, image_size)[0]
        images.append({"id": image_id, "file_name": f"{image_id:012d}.jpg"})
        coco_images.mkdir(exist_ok=True)
        picture.save(coco_images / f"{image_id:012d}.jpg")
        annotations.append({"id": 2 * i, "image_id": image_id, "caption": caption})
        annotations.append({"id": 2 * i + 1, "image_id": image_id, "caption": f" {caption} "})
        category = ("people", "animals")[i % 2]
        meta[f"img{i:03d}"] = {"prompt": caption, "category": category}
        (mjhq_images / category).mkdir(parents=True, exist_ok=True)
        picture.save(mjhq_images / category / f"img{i:03d}.jpg")
    (folder / "captions.json").write_text(json.dumps({"images": images, "annotations": annotations}))
    (folder / "meta_data.json").write_text(json.dumps(meta))
    tags = ("single_object", "two_object", "counting", "colors")
    (folder / "evaluation_metadata.jsonl").write_text(
        "".join(
            json.dumps({"tag": tags[i % 4], "include": [{"class": "star", "count": 1}], "prompt": caption})
            + "\n"
            for i, caption in enumerate(captions)
        )
    )
    (folder / "prompts.txt").write_text("\n".join(captions) + "\n\n")
    return {
        "coco": {"path": folder / "captions.json", "images": coco_images},
        "mjhq": {"path": folder / "meta_data.json", "images": mjhq_images},
        "geneval": {"path": folder / "evaluation_metadata.jsonl", "images": None},
        "lines": {"path": folder / "prompts.txt", "images": None},
    }


TINY_HPS_MODEL = "tiny-hps-test"  # an open_clip model config the test registers (not ViT-H-14's 1B weights)


def register_tiny_hps_model(folder: Path) -> str:
    """Write a tiny open_clip CLIP config (32 px images, one layer each, open_clip's own 49,408-token BPE
    vocabulary) and register it with open_clip under TINY_HPS_MODEL."""
    import open_clip

    config = {
        "embed_dim": 16,
        "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{TINY_HPS_MODEL}.json").write_text(json.dumps(config))
    open_clip.add_model_config(folder / f"{TINY_HPS_MODEL}.json")
    return TINY_HPS_MODEL


def save_tiny_hps(path: Path) -> Path:
    """A random tiny open_clip model (seed 0) saved the way HPS_v2.1_compressed.pt is: {'state_dict': ...}."""
    import open_clip

    register_tiny_hps_model(path.parent / "open_clip_configs")
    torch.manual_seed(0)
    model = open_clip.create_model(TINY_HPS_MODEL, pretrained=None)
    torch.save({"state_dict": model.state_dict()}, path)
    return path


def write_dpg_prompts(folder: Path, captions: list[str]) -> Path:
    """DPG-Bench's prompt folder layout (ELLA dpg_bench/prompts): one <item_id>.txt per prompt, numbered and
    named ids mixed as in the real folder."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, caption in enumerate(captions):
        item_id = str(10 - 3 * i) if i < len(captions) - 1 else "COCOval2014000000010363"
        (folder / f"{item_id}.txt").write_text(caption + "\n")
    return folder
