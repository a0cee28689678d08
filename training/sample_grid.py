"""The image grids of validation samples (training/ar_module.py, training/sampler_validation.py), each row
named in the image: a label column left of the rows, in PIL's default font, wrapped between words only (a
word longer than the column widens the column; it is never split).
"""

from __future__ import annotations

import numpy as np
import torch
import torchvision
from PIL import Image, ImageDraw, ImageFont

LABEL_WIDTH = 80  # px: the label column's narrowest width
MARGIN = 3  # px around a label
WIDEN_STEP = 8  # px: the column widens by this until every label fits its row


def wrap_words(text: str, font, width: float) -> list[str]:
    """`text` in lines of whole words, each line as many words as fit `width` px in `font` (a word wider than
    that takes a line of its own)."""
    lines: list[str] = []
    for word in text.split():
        if lines and font.getlength(f"{lines[-1]} {word}") <= width:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    return lines


def line_height(font) -> int:
    return font.getbbox("Ag")[3] + 1


def label_layout(labels: list[str], row_height: int, font) -> tuple[int, list[list[str]]]:
    """(column width, each label's lines): the narrowest column from LABEL_WIDTH up in which every label's
    lines fit the row height, or in which no label needs wrapping."""
    widest_word = max((font.getlength(word) for label in labels for word in label.split()), default=0)
    widest_label = max((font.getlength(label) for label in labels), default=0)
    width = max(LABEL_WIDTH, int(widest_word) + 2 * MARGIN)
    while True:
        lines = [wrap_words(label, font, width - 2 * MARGIN) for label in labels]
        tallest = max(len(wrapped) for wrapped in lines) * line_height(font)
        if tallest <= row_height or width >= widest_label + 2 * MARGIN:
            return width, lines
        width += WIDEN_STEP


def labelled_grid(rows: list[torch.Tensor], labels: list[str], padding: int = 2) -> torch.Tensor:
    """One grid row per entry of `rows` (each [N, 3, H, W] in [0, 1], the same N, H, W), with `labels[i]`
    left of row i; [3, H', W'] in [0, 1]."""
    count, _, height, _ = rows[0].shape
    images = torch.cat(rows).float().cpu()
    grid = torchvision.utils.make_grid(images, nrow=count, padding=padding, pad_value=1.0)
    font = ImageFont.load_default()
    width, lines = label_layout(labels, height, font)
    pixels = (grid.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    canvas = Image.new("RGB", (width + pixels.shape[1], pixels.shape[0]), "white")
    canvas.paste(Image.fromarray(pixels), (width, 0))
    draw = ImageDraw.Draw(canvas)
    step = line_height(font)
    for row, wrapped in enumerate(lines):  # each label centred on its row
        top = padding + row * (height + padding) + max(0, (height - len(wrapped) * step) // 2)
        for n, line in enumerate(wrapped):
            draw.text((MARGIN, top + n * step), line, fill="black", font=font)
    return torch.from_numpy(np.asarray(canvas).copy()).permute(2, 0, 1).float() / 255
