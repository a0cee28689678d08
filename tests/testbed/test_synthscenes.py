import io
import itertools
import json
import math
import re
from collections import Counter

import numpy as np
import pytest
import torch
from PIL import Image

from mulo_sd.testbed.captions import MAX_CAPTION_WORDS, VOCAB, caption_words, decode_caption, encode_caption
from mulo_sd.testbed.synthscenes import (
    BACKGROUNDS,
    COLOURS,
    MIN_SEPARATION,
    RELATION_MIN_OFFSET,
    RELATIONS,
    SHAPES,
    SIZES,
    render,
    render_scene,
    sample_scene,
    write_caption,
)

COUNT_WORD = {1: "a|an", 2: "two", 3: "three", 4: "four"}
PLURAL = {"cross": "crosses"}


def scenes(count, seed=11):
    return [sample_scene(np.random.default_rng([seed, i])) for i in range(count)]


def png_bytes(image):
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def test_constants_for_classifiers():
    assert len(SHAPES) >= 6 and len(COLOURS) == 8 and list(SIZES) == ["small", "medium", "large"]
    assert RELATIONS == ["left of", "right of", "above", "below"]
    assert BACKGROUNDS == ["gradient", "striped", "checkered", "noisy"]
    closest = min(math.dist(a, b) for a, b in itertools.combinations(COLOURS.values(), 2))
    assert closest > 80, f"object colours too close: {closest}"


def test_same_seed_same_png_bytes_and_different_seed_differs():
    first, caption, attributes = render_scene(seed=3, index=5, size=64)
    again, caption_again, attributes_again = render_scene(seed=3, index=5, size=64)
    assert png_bytes(first) == png_bytes(again)
    assert (caption, attributes) == (caption_again, attributes_again)
    assert png_bytes(render(json.loads(json.dumps(attributes)), 64)) == png_bytes(first)  # record suffices
    assert png_bytes(render_scene(seed=4, index=5, size=64)[0]) != png_bytes(first)
    assert png_bytes(render_scene(seed=3, index=6, size=64)[0]) != png_bytes(first)


def test_attribute_record_describes_the_objects():
    for attributes in scenes(300):
        objects = attributes["objects"]
        assert 1 <= len(objects) <= 4
        counts = Counter((o["colour"], o["shape"]) for o in objects)
        assert [(g["colour"], g["shape"], g["count"]) for g in attributes["groups"]] == [
            (colour, shape, count) for (colour, shape), count in counts.items()
        ]
        for o in objects:
            assert tuple(o["rgb"]) == COLOURS[o["colour"]] and o["radius"] == SIZES[o["size"]]
            assert o["radius"] <= o["x"] <= 1 - o["radius"] and o["radius"] <= o["y"] <= 1 - o["radius"]
        for a, b in itertools.combinations(objects, 2):  # overlaps stay partial: nothing fully hidden
            assert (
                math.dist((a["x"], a["y"]), (b["x"], b["y"]))
                >= MIN_SEPARATION * (a["radius"] + b["radius"]) - 1e-3
            )


def test_caption_states_counts_colours_shapes_and_relation():
    for attributes in scenes(400):
        caption = write_caption(attributes)
        groups = attributes["groups"]
        assert caption.endswith(f" on a {attributes['background']['kind']} background")
        for g in groups:
            shape = g["shape"] if g["count"] == 1 else PLURAL.get(g["shape"], g["shape"] + "s")
            phrase = rf"\b({COUNT_WORD[g['count']]}) {g['colour']} {shape}\b"
            assert re.search(phrase, caption), (caption, g)
        stated = [r for r in RELATIONS if f" {r} " in caption]
        assert len(stated) == len(attributes["relations"]) <= 1, caption
        if stated:
            # recompute the relation from the objects' own centres
            centroids = []
            for g in groups[:2]:
                members = [
                    o for o in attributes["objects"] if (o["colour"], o["shape"]) == (g["colour"], g["shape"])
                ]
                centroids.append(np.mean([[o["x"], o["y"]] for o in members], axis=0))
            dx, dy = centroids[0] - centroids[1]
            expected = (
                ("left of" if dx < 0 else "right of")
                if abs(dx) > abs(dy)
                else ("above" if dy < 0 else "below")
            )
            assert stated == [expected], (caption, dx, dy)
            assert max(abs(dx), abs(dy)) >= RELATION_MIN_OFFSET - 1e-3
            first, second = (re.escape(f"{g['colour']} ") for g in groups[:2])
            assert re.search(rf"{first}\w+ {stated[0]} (a|an|two|three|four) {second}", caption), caption


def test_scenes_cover_every_attribute_value():
    seen = Counter()
    for attributes in scenes(600, seed=2):
        seen.update(("shape", o["shape"]) for o in attributes["objects"])
        seen.update(("colour", o["colour"]) for o in attributes["objects"])
        seen.update(("size", o["size"]) for o in attributes["objects"])
        seen.update(("count", g["count"]) for g in attributes["groups"])
        seen.update(("relation", r["relation"]) for r in attributes["relations"])
        seen[("background", attributes["background"]["kind"])] += 1
    expected = (
        [("shape", s) for s in SHAPES] + [("colour", c) for c in COLOURS] + [("size", s) for s in SIZES]
        + [("count", n) for n in (1, 2, 3, 4)] + [("relation", r) for r in RELATIONS]
        + [("background", b) for b in BACKGROUNDS]
    )  # fmt: skip
    assert [value for value in expected if seen[value] == 0] == []


def test_every_caption_encodes_and_decodes():
    longest = 0
    for attributes in scenes(500, seed=7):
        caption = write_caption(attributes)
        ids = encode_caption(caption, MAX_CAPTION_WORDS)
        assert ids.dtype == torch.long and ids.shape == (MAX_CAPTION_WORDS,)
        assert decode_caption(ids) == " ".join(caption_words(caption))
        longest = max(longest, len(caption_words(caption)))
    assert longest > 10


def test_longest_possible_caption_fits():
    objects = [
        {"colour": c, "shape": "triangle", "x": 0.1 + 0.25 * i, "y": 0.5}
        for i, c in enumerate(["red", "blue", "pink", "cyan"])
    ]
    attributes = {
        "objects": objects,
        "groups": [{"colour": o["colour"], "shape": "triangle", "count": 1} for o in objects],
        "relations": [{"subject": 0, "relation": "right of", "object": 1}],
        "background": {"kind": "checkered"},
    }
    caption = write_caption(attributes)
    expected = "a red triangle right of a blue triangle, a pink triangle and a cyan triangle"
    expected += " on a checkered background"
    assert caption == expected
    assert len(caption_words(caption)) == MAX_CAPTION_WORDS
    encode_caption(caption)


def test_caption_codec_errors_and_padding():
    assert VOCAB[0] == "<pad>" and len(set(VOCAB)) == len(VOCAB)
    ids = encode_caption("Two RED circles, on a striped background.", 10)
    assert ids.tolist()[7:] == [0, 0, 0] and decode_caption(ids) == "two red circles on a striped background"
    with pytest.raises(ValueError, match="'zebra'"):
        encode_caption("a red zebra", 8)
    with pytest.raises(ValueError, match="more than max_len=3"):
        encode_caption("a red circle on", 3)
    with pytest.raises(ValueError, match="id 999"):
        decode_caption([1, 999])


def test_images_are_textured_and_objects_visible():
    for index in range(40):
        image, _, attributes = render_scene(seed=1, index=index, size=128)
        pixels = np.asarray(image)
        assert pixels.shape == (128, 128, 3) and pixels.dtype == np.uint8
        background = np.asarray(render(dict(attributes, objects=[]), 128), dtype=np.float64)
        assert background.std() > 5, attributes["background"]
        for o in attributes["objects"]:
            r = o["radius"] * 128
            x0, x1 = int(o["x"] * 128 - r), int(o["x"] * 128 + r) + 1
            y0, y1 = int(o["y"] * 128 - r), int(o["y"] * 128 + r) + 1
            box = pixels[max(0, y0) : y1, max(0, x0) : x1]
            exact = np.all(box == np.array(o["rgb"], dtype=np.uint8), axis=-1).sum()
            assert exact >= 0.15 * (2 * r) ** 2, (index, o, exact)


@pytest.mark.parametrize("size", [32, 64, 128])
def test_same_scene_renders_at_any_size(size):
    image, _, attributes = render_scene(seed=0, index=9, size=128)
    small = render(attributes, size)
    assert small.size == (size, size) and small.mode == "RGB"
    reference = np.asarray(image.resize((size, size), Image.Resampling.BOX), dtype=np.float64)
    assert np.abs(np.asarray(small, dtype=np.float64) - reference).mean() < 6
    # anti-aliased: object edges produce colours that are neither an object colour nor a background value
    assert len(np.unique(np.asarray(small).reshape(-1, 3), axis=0)) > 20


def test_render_refuses_tiny_sizes_and_negative_seeds():
    attributes = scenes(1)[0]
    with pytest.raises(ValueError, match="image size must be an integer >= 8"):
        render(attributes, 4)
    with pytest.raises(ValueError, match="seed and index must be >= 0"):
        render_scene(-1, 0, 32)
