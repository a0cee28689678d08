"""SynthScenes: procedurally rendered captioned scenes, the testbed's stand-in for LAION-COCO-Aesthetic.

A scene is 1-4 flat-coloured shapes over a textured, muted background. Textures (gradients, stripes,
checks, smooth noise) make a VQ token depend on its neighbours, so local context matters as it does in
natural images. Each scene comes with a caption in a small regular grammar (its words are the testbed's
text vocabulary, see `captions.py`) and an attribute record holding everything needed to check the
caption from pixels later (SceneEval).

    image, caption, attributes = render_scene(seed=0, index=7, size=128)
    # caption: "two red circles left of a blue star on a striped background"
    small = render(attributes, 32)   # the same scene at another resolution

Geometry lives in normalised coordinates (x right, y down, both in [0, 1]), so any resolution renders the
same scene. Shapes are drawn at 4x and box-downsampled (exact pixel coverage, i.e. anti-aliased edges);
stripe and check edges are anti-aliased analytically. Rendering uses only IEEE-exact float operations
per pixel and the per-sample RNG is seeded by (seed, index), so a sample's PNG bytes do not depend on
the process that made it.
"""

from __future__ import annotations

import colorsys
import math

import numpy as np
from PIL import Image, ImageDraw

SHAPES = ["circle", "square", "triangle", "star", "diamond", "hexagon", "cross"]
PLURALS = {shape: shape + "es" if shape.endswith("ss") else shape + "s" for shape in SHAPES}
COLOURS = {  # saturated, pairwise far apart in RGB, none close to a muted background colour
    "red": (220, 30, 30),
    "orange": (245, 130, 0),
    "yellow": (240, 220, 0),
    "green": (20, 160, 40),
    "cyan": (0, 200, 220),
    "blue": (30, 60, 230),
    "purple": (130, 40, 200),
    "pink": (250, 100, 200),
}
SIZES = {"small": 0.08, "medium": 0.12, "large": 0.17}  # half the side of the bounding square / image side
RELATIONS = ["left of", "right of", "above", "below"]
BACKGROUNDS = ["gradient", "striped", "checkered", "noisy"]
COUNT_WORDS = {2: "two", 3: "three", 4: "four"}  # one object is written "a"/"an"

MAX_OBJECTS = 4
SUPERSAMPLE = 4
MIN_SIZE = 8
# Centres of two objects are at least this fraction of the sum of their radii apart: overlaps stay
# partial, so no object is ever hidden behind another.
MIN_SEPARATION = 0.8
# A relation is stated only when the centroids are clearly apart along one axis: the dominant offset is
# at least RELATION_MIN_OFFSET (fraction of the image side) and RELATION_MIN_RATIO times the other one.
RELATION_MIN_OFFSET = 0.15
RELATION_MIN_RATIO = 1.25


def _regular_polygon(corners: int, start_degrees: float, radii: list[float]) -> list[tuple[float, float]]:
    points = []
    for i in range(corners * len(radii)):
        angle = math.radians(start_degrees + 360.0 * i / (corners * len(radii)))
        radius = radii[i % len(radii)]
        points.append((radius * math.cos(angle), radius * math.sin(angle)))
    return points


# Outlines in a unit bounding square [-1, 1]^2, y down; no rotation, so "square" and "diamond" stay distinct.
_POLYGONS = {
    "square": [(-1.0, -1.0), (1.0, -1.0), (1.0, 1.0), (-1.0, 1.0)],
    "triangle": [(0.0, -1.0), (1.0, 1.0), (-1.0, 1.0)],
    "diamond": [(0.0, -1.0), (0.75, 0.0), (0.0, 1.0), (-0.75, 0.0)],
    "hexagon": _regular_polygon(6, 0.0, [1.0]),
    "star": _regular_polygon(5, -90.0, [1.0, 0.45]),
    "cross": [
        (-0.35, -1.0),
        (0.35, -1.0),
        (0.35, -0.35),
        (1.0, -0.35),
        (1.0, 0.35),
        (0.35, 0.35),
        (0.35, 1.0),
        (-0.35, 1.0),
        (-0.35, 0.35),
        (-1.0, 0.35),
        (-1.0, -0.35),
        (-0.35, -0.35),
    ],
}


def _muted_colours(rng: np.random.Generator) -> list[list[int]]:
    """Two low-saturation colours whose brightness differs enough for the texture to be visible."""
    hue = float(rng.uniform(0.0, 1.0))
    value = float(rng.uniform(0.3, 0.8))
    step = float(rng.uniform(0.15, 0.3))
    other_value = value + step if value + step <= 0.95 else value - step
    colours = []
    for h, v in ((hue, value), ((hue + float(rng.uniform(-0.15, 0.15))) % 1.0, other_value)):
        r, g, b = colorsys.hsv_to_rgb(h, float(rng.uniform(0.05, 0.3)), v)
        colours.append([round(255 * r), round(255 * g), round(255 * b)])
    return colours


def _sample_background(rng: np.random.Generator) -> dict:
    kind = BACKGROUNDS[int(rng.integers(len(BACKGROUNDS)))]
    background = {"kind": kind, "colours": _muted_colours(rng)}
    if kind == "gradient":
        background["angle"] = round(float(rng.uniform(0.0, 360.0)), 2)
    elif kind == "striped":
        background["angle"] = round(float(rng.uniform(0.0, 180.0)), 2)
        background["period"] = round(float(rng.uniform(0.06, 0.25)), 4)
    elif kind == "checkered":
        background["angle"] = round(float(rng.uniform(0.0, 90.0)), 2)
        background["cell"] = round(float(rng.uniform(0.06, 0.2)), 4)
    else:
        cells = int(rng.integers(3, 9))
        background["grid"] = np.round(rng.uniform(0.0, 1.0, (cells + 1, cells + 1)), 3).tolist()
    return background


def _place(radii: list[float], rng: np.random.Generator) -> list[tuple[float, float]]:
    """Centres keeping every object inside the image and overlaps partial (rejection sampling)."""
    while True:
        centres: list[tuple[float, float]] = []
        for radius in radii:
            for _ in range(100):
                x, y = (round(float(v), 4) for v in rng.uniform(radius, 1.0 - radius, 2))
                if all(
                    math.hypot(x - cx, y - cy) >= MIN_SEPARATION * (radius + radii[j])
                    for j, (cx, cy) in enumerate(centres)
                ):
                    centres.append((x, y))
                    break
            else:
                break  # crowded: start the layout again
        if len(centres) == len(radii):
            return centres


def _relation(subject: tuple[float, float], other: tuple[float, float]) -> str | None:
    """Where the subject centroid lies relative to the other one, if it is clear (image y points down)."""
    dx, dy = subject[0] - other[0], subject[1] - other[1]
    major, minor = (abs(dx), abs(dy)) if abs(dx) >= abs(dy) else (abs(dy), abs(dx))
    if major < RELATION_MIN_OFFSET or major < RELATION_MIN_RATIO * minor:
        return None
    if abs(dx) >= abs(dy):
        return "left of" if dx < 0 else "right of"
    return "above" if dy < 0 else "below"


def _groups(objects: list[dict]) -> list[dict]:
    """Objects grouped by (colour, shape) in order of first appearance, with count and centroid."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for obj in objects:
        groups.setdefault((obj["colour"], obj["shape"]), []).append(obj)
    return [
        {
            "colour": colour,
            "shape": shape,
            "count": len(members),
            "centroid": [
                round(sum(o["x"] for o in members) / len(members), 4),
                round(sum(o["y"] for o in members) / len(members), 4),
            ],
        }
        for (colour, shape), members in groups.items()
    ]


def sample_scene(rng: np.random.Generator) -> dict:
    """Draw a scene's attribute record (objects in draw order, groups, relations, background)."""
    n_objects = int(rng.integers(1, MAX_OBJECTS + 1))
    n_groups = int(rng.integers(1, n_objects + 1))
    # Few groups for many objects on purpose: counts above one must be common, not a coincidence.
    kinds = rng.choice(len(COLOURS) * len(SHAPES), size=n_groups, replace=False)
    membership = list(range(n_groups)) + [int(g) for g in rng.integers(0, n_groups, n_objects - n_groups)]
    rng.shuffle(membership)
    colour_names = list(COLOURS)
    size_names = [list(SIZES)[int(i)] for i in rng.integers(0, len(SIZES), n_objects)]
    centres = _place([SIZES[name] for name in size_names], rng)
    objects = []
    for group, size_name, (x, y) in zip(membership, size_names, centres, strict=True):
        colour = colour_names[int(kinds[group]) // len(SHAPES)]
        objects.append(
            {
                "shape": SHAPES[int(kinds[group]) % len(SHAPES)],
                "colour": colour,
                "rgb": list(COLOURS[colour]),
                "size": size_name,
                "x": x,
                "y": y,
                "radius": SIZES[size_name],
            }
        )
    groups = _groups(objects)
    relations = []
    if len(groups) >= 2:
        relation = _relation(tuple(groups[0]["centroid"]), tuple(groups[1]["centroid"]))
        if relation is not None:
            relations.append({"subject": 0, "relation": relation, "object": 1})
    return {
        "objects": objects,
        "groups": groups,
        "relations": relations,
        "background": _sample_background(rng),
    }


def _group_phrase(group: dict) -> str:
    if group["count"] == 1:
        article = "an" if group["colour"][0] in "aeiou" else "a"
        return f"{article} {group['colour']} {group['shape']}"
    return f"{COUNT_WORDS[group['count']]} {group['colour']} {PLURALS[group['shape']]}"


def write_caption(attributes: dict) -> str:
    """The caption of a scene, e.g. "two red circles left of a blue star on a striped background".

    Groups are listed in order; a relation (always between the first two groups) joins them directly;
    with three or more items: "a X, a Y and a Z on ...".
    """
    phrases = [_group_phrase(group) for group in attributes["groups"]]
    for relation in attributes["relations"]:
        subject, obj = relation["subject"], relation["object"]
        phrases[subject] = f"{phrases[subject]} {relation['relation']} {phrases[obj]}"
        phrases.pop(obj)
    body = phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]
    return f"{body} on a {attributes['background']['kind']} background"


def _background(background: dict, size: int) -> np.ndarray:
    """Background texture at `size` px as uint8 [size, size, 3]; edges anti-aliased analytically."""
    centres = (np.arange(size, dtype=np.float64) + 0.5) / size
    x, y = centres[None, :], centres[:, None]
    kind = background["kind"]
    if kind == "noisy":
        grid = np.asarray(background["grid"], dtype=np.float64)
        cells = grid.shape[0] - 1
        position = centres * cells
        index = np.minimum(np.floor(position).astype(np.int64), cells - 1)
        fraction = position - index
        weight = fraction * fraction * (3.0 - 2.0 * fraction)  # smoothstep: no visible cell seams
        row = grid[index] * (1.0 - weight[:, None]) + grid[index + 1] * weight[:, None]
        mix = row[:, index] * (1.0 - weight[None, :]) + row[:, index + 1] * weight[None, :]
    else:
        angle = math.radians(background["angle"])
        cos, sin = math.cos(angle), math.sin(angle)
        if kind == "gradient":
            mix = ((x - 0.5) * cos + (y - 0.5) * sin) / (abs(cos) + abs(sin)) + 0.5
        elif kind == "striped":
            mix = _square_wave(x * cos + y * sin, background["period"], size)
        else:
            a = _square_wave(x * cos + y * sin, 2 * background["cell"], size)
            b = _square_wave(y * cos - x * sin, 2 * background["cell"], size)
            mix = a + b - 2.0 * a * b  # soft XOR of the two stripe sets
    low, high = (np.asarray(c, dtype=np.float64) for c in background["colours"])
    image = low + np.broadcast_to(mix, (size, size))[..., None] * (high - low)
    return np.rint(image).astype(np.uint8)


def _square_wave(projection: np.ndarray, period: float, size: int) -> np.ndarray:
    """0/1 bands of half a period each, blended over one pixel at the edges."""
    triangle = 2.0 * np.abs(projection / period - np.floor(projection / period) - 0.5)
    pixels_from_edge = (triangle - 0.5) / 2.0 * period * size  # the triangle wave has slope 2 per period
    return np.clip(pixels_from_edge + 0.5, 0.0, 1.0)


def _draw_object(draw: ImageDraw.ImageDraw, obj: dict, side: int) -> None:
    # PIL puts integer coordinates at pixel centres; continuous coordinate c maps to c * side - 0.5.
    cx, cy, radius = obj["x"] * side - 0.5, obj["y"] * side - 0.5, obj["radius"] * side
    colour = tuple(obj["rgb"])
    if obj["shape"] == "circle":
        draw.ellipse([cx - radius, cy - radius, cx + radius, cy + radius], fill=colour)
    else:
        draw.polygon(
            [(cx + radius * px, cy + radius * py) for px, py in _POLYGONS[obj["shape"]]], fill=colour
        )


def render(attributes: dict, size: int) -> Image.Image:
    """Render a scene's attribute record as an RGB image of `size` x `size` pixels."""
    if not isinstance(size, int) or size < MIN_SIZE:
        raise ValueError(f"image size must be an integer >= {MIN_SIZE} px, got {size!r}")
    side = size * SUPERSAMPLE
    # The background is already anti-aliased at `size`: nearest-upscaled, its pixels survive the box filter.
    canvas = Image.fromarray(_background(attributes["background"], size)).resize(
        (side, side), Image.Resampling.NEAREST
    )
    draw = ImageDraw.Draw(canvas)
    for obj in attributes["objects"]:
        _draw_object(draw, obj, side)
    return canvas.reduce(SUPERSAMPLE)


def render_scene(seed: int, index: int, size: int) -> tuple[Image.Image, str, dict]:
    """Scene number `index` of the SynthScenes stream `seed`: (image, caption, attribute record)."""
    if seed < 0 or index < 0:
        raise ValueError(f"seed and index must be >= 0, got seed={seed}, index={index}")
    attributes = sample_scene(np.random.default_rng([seed, index]))
    attributes.update(size=size, seed=seed, index=index)
    return render(attributes, size), write_caption(attributes), attributes
