"""SceneEval's caption checks: a SynthScenes caption turned into attribute checks, and whether what SceneEval
read from an image passes them (the testbed's GenEval).

    per_prompt = score(model, images, captions)          # [B] fraction of each caption's checks passed
    results = check_results(*model.predict(images), captions, backgrounds=model.predict_background(images))
    kind_scores(results)   # per prompt: {"object": .., "count": .., "colour": .., ["relation"], "background"}

A caption is turned into checks by `parse_caption`; per group phrase ("two red circles", "a blue star"):
- object:   the pair (colour, shape) is present, i.e. its read count is >= 1;
- count:    its read count equals the stated count ("a"/"an" state one: a SynthScenes group holds every
            object of its colour and shape);
- colour:   some object of that colour is present (read counts of that colour, over all shapes, sum to >= 1);
and for "X <relation> Y" (always the first two groups):
- relation: both pairs are present and their read centroids satisfy the relation with the caption rule's
            margins relaxed (see `relation_holds`), so that small centroid errors do not fail true images.
As in GenEval, an image's score for its prompt is passed / total checks of these four kinds (CHECK_KINDS),
and a method's accuracy is the mean over prompts; per check kind, the fraction of checks passed.

Scored beside them, never in the prompt score (so every score measured before it stays comparable):
- background: the kind SceneEval's background head reads (`SceneEval.predict_background`) is the caption's
  "on a <kind> background" (`background_check`); `check_results` adds it when given the read kinds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mulo_sd.testbed.captions import caption_words
from mulo_sd.testbed.scene_truth import PAIR_INDEX
from mulo_sd.testbed.synthscenes import (
    BACKGROUNDS,
    COLOURS,
    COUNT_WORDS,
    PLURALS,
    RELATION_MIN_OFFSET,
    RELATIONS,
    SHAPES,
)

CHECK_KINDS = ("object", "count", "colour", "relation")  # the kinds of the prompt score
BACKGROUND = "background"  # the kind scored beside the prompt score
# A relation check passes when the subject is offset in the stated direction by at least this fraction of
# the image side and no less than across that direction: half the caption's margin and ratio 1 instead of
# RELATION_MIN_RATIO, so a true scene passes despite small centroid errors (GenEval is similarly lenient).
RELATION_CHECK_OFFSET = RELATION_MIN_OFFSET / 2


@dataclass(frozen=True)
class Check:
    """One attribute check of a caption (kinds and pass rules in the module docstring)."""

    kind: str  # one of CHECK_KINDS, or BACKGROUND
    colour: str | None = None  # None for a background check
    shape: str | None = None  # None for colour and background checks
    count: int | None = None  # count checks only
    relation: str | None = None  # relation checks: (colour, shape) `relation` other
    other: tuple[str, str] | None = None
    background: str | None = None  # background checks: the stated kind


_QUANTITIES = {"a": 1, "an": 1, **{word: n for n, word in COUNT_WORDS.items()}}
_SHAPE_WORDS = {shape: (shape, False) for shape in SHAPES} | {p: (s, True) for s, p in PLURALS.items()}
_RELATION_WORDS = {tuple(relation.split()): relation for relation in RELATIONS}


def _split_background(text: str) -> tuple[list[str], str]:
    """The caption's words before "on a <kind> background", and the kind."""
    words = caption_words(text)
    if len(words) < 4 or words[-4:-2] != ["on", "a"] or words[-1] != "background":
        raise ValueError(f"a SynthScenes caption ends with 'on a <kind> background': {text!r}")
    if words[-2] not in BACKGROUNDS:
        raise ValueError(f"unknown background {words[-2]!r} (known: {', '.join(BACKGROUNDS)}) in {text!r}")
    return words[:-4], words[-2]


def _parse_group(words: list[str], i: int, text: str) -> tuple[tuple[int, str, str], int]:
    """(count, colour, shape) of the group phrase starting at word i, and the index after it."""
    if i + 3 > len(words):
        raise ValueError(
            f"caption ends inside a group phrase (expected '<a|two..> <colour> <shape>'): {text!r}"
        )
    quantity, colour, shape_word = words[i : i + 3]
    if quantity not in _QUANTITIES:
        raise ValueError(f"expected 'a', 'an' or a count word at word {i} ({quantity!r}) of {text!r}")
    if colour not in COLOURS:
        raise ValueError(f"unknown colour {colour!r} (known: {', '.join(COLOURS)}) in {text!r}")
    if shape_word not in _SHAPE_WORDS:
        raise ValueError(f"unknown shape {shape_word!r} (known: {', '.join(SHAPES)}) in {text!r}")
    shape, plural = _SHAPE_WORDS[shape_word]
    count = _QUANTITIES[quantity]
    if plural != (count > 1):
        raise ValueError(f"{quantity!r} does not agree with {shape_word!r} in {text!r}")
    return (count, colour, shape), i + 3


def parse_caption(text: str) -> list[Check]:
    """The checks of the prompt score a SynthScenes caption states: object, count and colour per group, in
    caption order, then the relation between the first two groups if there is one. The background is
    checked apart (`background_check`).

    Grammar (punctuation ignored): GROUP [RELATION GROUP] {[and] GROUP} on a BACKGROUND background, with
    GROUP = (a|an) COLOUR SHAPE | (two|three|four) COLOUR SHAPES.
    """
    body, _ = _split_background(text)
    group, i = _parse_group(body, 0, text)
    groups, relation = [group], None
    while i < len(body):
        matched = next((r for r in _RELATION_WORDS if tuple(body[i : i + len(r)]) == r), None)
        if matched is not None:
            if len(groups) != 1:
                raise ValueError(f"a relation may only join the first two groups: {text!r}")
            relation, i = _RELATION_WORDS[matched], i + len(matched)
        elif body[i] == "and":
            i += 1
        group, i = _parse_group(body, i, text)
        groups.append(group)
    checks = []
    for count, colour, shape in groups:
        checks += [
            Check("object", colour, shape),
            Check("count", colour, shape, count=count),
            Check("colour", colour),
        ]
    if relation is not None:
        (_, colour, shape), (_, other_colour, other_shape) = groups[:2]
        checks.append(Check("relation", colour, shape, relation=relation, other=(other_colour, other_shape)))
    return checks


def background_check(text: str) -> Check:
    """The background check of a SynthScenes caption: its "on a <kind> background"."""
    return Check(BACKGROUND, background=_split_background(text)[1])


def relation_holds(subject: torch.Tensor, other: torch.Tensor, relation: str) -> bool:
    """Whether centroid `subject` (x, y) lies `relation` of centroid `other` (image y points down): the offset
    in the stated direction is >= RELATION_CHECK_OFFSET and >= the absolute offset across it."""
    dx, dy = (float(v) for v in subject - other)
    along, across = {"left of": (-dx, dy), "right of": (dx, dy), "above": (-dy, dx), "below": (dy, dx)}[
        relation
    ]
    return along >= RELATION_CHECK_OFFSET and along >= abs(across)


def check_passed(check: Check, counts: torch.Tensor, centroids: torch.Tensor) -> bool:
    """Whether one image's read counts [P] and centroids [P,2] pass `check` (one of CHECK_KINDS)."""
    if check.kind == "colour":
        start = list(COLOURS).index(check.colour) * len(SHAPES)
        return int(counts[start : start + len(SHAPES)].sum()) >= 1
    i = PAIR_INDEX[(check.colour, check.shape)]
    if check.kind == "object":
        return int(counts[i]) >= 1
    if check.kind == "count":
        return int(counts[i]) == check.count
    if check.kind == "relation":
        j = PAIR_INDEX[check.other]
        present = int(counts[i]) >= 1 and int(counts[j]) >= 1
        return present and relation_holds(centroids[i], centroids[j], check.relation)
    raise ValueError(f"unknown check kind {check.kind!r} (known: {', '.join(CHECK_KINDS)})")


def check_results(
    counts: torch.Tensor,
    centroids: torch.Tensor,
    captions: list[str],
    backgrounds: torch.Tensor | None = None,
) -> list[list[tuple[Check, bool]]]:
    """Each check of caption i and whether image i passes it, from read counts [B,P], centroids [B,P,2].
    With `backgrounds` (read kinds [B], indices into BACKGROUNDS: `SceneEval.predict_background`), each
    caption's list ends with its background check too (scored beside the prompt score, module docstring)."""
    if len(captions) != counts.shape[0]:
        raise ValueError(f"{counts.shape[0]} images but {len(captions)} captions")
    counts, centroids = counts.cpu(), centroids.float().cpu()
    results = [
        [(check, check_passed(check, counts[b], centroids[b])) for check in parse_caption(caption)]
        for b, caption in enumerate(captions)
    ]
    if backgrounds is not None:
        if backgrounds.shape != (len(captions),):
            raise ValueError(
                f"backgrounds must be the read kinds [B] of the {len(captions)} images, got shape "
                f"{tuple(backgrounds.shape)}"
            )
        for checks, caption, kind in zip(results, captions, backgrounds.tolist(), strict=True):
            check = background_check(caption)
            checks.append((check, BACKGROUNDS[kind] == check.background))
    return results


def prompt_scores(results: list[list[tuple[Check, bool]]]) -> torch.Tensor:
    """Per-prompt score [B] of `check_results`: passed / total checks of CHECK_KINDS (background apart)."""
    scores = []
    for checks in results:
        scored = [passed for check, passed in checks if check.kind in CHECK_KINDS]
        scores.append(sum(scored) / len(scored))
    return torch.tensor(scores)


def kind_scores(results: list[list[tuple[Check, bool]]]) -> list[dict[str, float]]:
    """Per prompt of `check_results`: for each kind of check it states (CHECK_KINDS, then BACKGROUND when
    `check_results` had the read backgrounds), the fraction of those passed."""
    scores = []
    for checks in results:
        kinds = {kind: [passed for check, passed in checks if check.kind == kind] for kind in CHECK_KINDS}
        kinds[BACKGROUND] = [passed for check, passed in checks if check.kind == BACKGROUND]
        scores.append({kind: sum(passed) / len(passed) for kind, passed in kinds.items() if passed})
    return scores


def score(model, images: torch.Tensor, captions: list[str]) -> torch.Tensor:
    """Per-image GenEval-style score [B]: the fraction of its caption's checks the image passes. `model` is
    anything with `predict(images) -> (counts [B,P], centroids [B,P,2])`, normally a SceneEval in eval mode
    (as `from_pretrained` returns it)."""
    if len(captions) != images.shape[0]:
        raise ValueError(f"{images.shape[0]} images but {len(captions)} captions")
    counts, centroids = model.predict(images)
    return prompt_scores(check_results(counts, centroids, captions))
