"""The testbed's closed caption vocabulary: every word a SynthScenes caption can use, and word-id codecs.

The testbed GPT embeds these ids directly (no external text model). The order of `VOCAB` is part of every
trained testbed checkpoint: append new words at the end, never reorder.
"""

from __future__ import annotations

import string

import torch

PAD = "<pad>"
VOCAB: list[str] = [
    PAD,
    # grammar
    "a", "an", "two", "three", "four", "and", "on", "background",
    # relations
    "left", "right", "of", "above", "below",
    # colours
    "red", "orange", "yellow", "green", "cyan", "blue", "purple", "pink",
    # shapes, singular then plural
    "circle", "square", "triangle", "star", "diamond", "hexagon", "cross",
    "circles", "squares", "triangles", "stars", "diamonds", "hexagons", "crosses",
    # backgrounds
    "gradient", "striped", "checkered", "noisy",
]  # fmt: skip
WORD_IDS = {word: i for i, word in enumerate(VOCAB)}
PAD_ID = WORD_IDS[PAD]
# Longest SynthScenes caption: four single objects with a two-word relation,
# "a X Y left of a X Y, a X Y and a X Y on a K background" = 3 + 2 + 3 + 3 + 1 + 3 + 4 words.
MAX_CAPTION_WORDS = 19

_PUNCTUATION_TO_SPACE = str.maketrans(string.punctuation, " " * len(string.punctuation))


def caption_words(text: str) -> list[str]:
    """Lower-cased words of a caption, punctuation removed."""
    return text.lower().translate(_PUNCTUATION_TO_SPACE).split()


def encode_caption(text: str, max_len: int = MAX_CAPTION_WORDS) -> torch.Tensor:
    """Word ids of a caption, padded with PAD_ID (0) to `max_len`: int64 [max_len]."""
    words = caption_words(text)
    if len(words) > max_len:
        raise ValueError(f"caption has {len(words)} words, more than max_len={max_len}: {text!r}")
    ids = torch.full((max_len,), PAD_ID, dtype=torch.long)
    for i, word in enumerate(words):
        if word not in WORD_IDS:
            raise ValueError(f"word {word!r} is not in the caption vocabulary (caption: {text!r})")
        ids[i] = WORD_IDS[word]
    return ids


def decode_caption(ids: torch.Tensor | list[int]) -> str:
    """The words of `ids` joined by spaces, padding dropped."""
    ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
    for i in ids:
        if not 0 <= i < len(VOCAB):
            raise ValueError(f"caption id {i} is outside the vocabulary of {len(VOCAB)} words")
    return " ".join(VOCAB[i] for i in ids if i != PAD_ID)
