"""SceneEval's caption checks (mulo_sd/testbed/scene_checks.py): parsing, the pass rules and the scores, the
background check beside the prompt score."""

import numpy as np
import pytest
import torch

from mulo_sd.testbed.scene_checks import (
    BACKGROUND,
    RELATION_CHECK_OFFSET,
    Check,
    background_check,
    check_results,
    kind_scores,
    parse_caption,
    prompt_scores,
    relation_holds,
    score,
)
from mulo_sd.testbed.scene_truth import PAIR_INDEX, PAIRS, batch_targets
from mulo_sd.testbed.synthscenes import BACKGROUNDS, render_scene, sample_scene, write_caption


class Oracle:
    """Reads the true counts and centroids of known scenes, whatever the pixels: tests the scoring alone."""

    def __init__(self, attributes: list[dict]):
        self.attributes = attributes

    def predict(self, images):
        counts, centroids, _ = batch_targets(self.attributes)
        return counts, centroids


def test_parse_hand_captions():
    checks = parse_caption("two red circles left of a blue star on a striped background")
    assert checks == [
        Check("object", "red", "circle"),
        Check("count", "red", "circle", count=2),
        Check("colour", "red"),
        Check("object", "blue", "star"),
        Check("count", "blue", "star", count=1),
        Check("colour", "blue"),
        Check("relation", "red", "circle", relation="left of", other=("blue", "star")),
    ]
    checks = parse_caption("an orange square, three green crosses and a pink hexagon on a noisy background")
    assert [(c.kind, c.colour, c.shape, c.count) for c in checks if c.kind == "count"] == [
        ("count", "orange", "square", 1),
        ("count", "green", "cross", 3),
        ("count", "pink", "hexagon", 1),
    ]
    assert not [c for c in checks if c.kind == "relation"]
    below = parse_caption("four cyan diamonds below two purple triangles on a gradient background")[-1]
    assert below == Check("relation", "cyan", "diamond", relation="below", other=("purple", "triangle"))


@pytest.mark.parametrize(
    ("caption", "message"),
    [
        ("a red circle", "ends with 'on a <kind> background'"),
        ("a red circle on a plaid background", "unknown background 'plaid'"),
        ("a magenta circle on a noisy background", "unknown colour 'magenta'"),
        ("a red blob on a noisy background", "unknown shape 'blob'"),
        ("two red circle on a noisy background", "'two' does not agree with 'circle'"),
        ("a red circles on a noisy background", "'a' does not agree with 'circles'"),
        ("one red circle on a noisy background", "count word at word 0 .'one'."),
        ("a red circle left of on a noisy background", "ends inside a group phrase"),
        ("a red circle, a blue star above a green cross on a noisy background", "first two groups"),
    ],
)
def test_parse_rejects_bad_captions(caption, message):
    with pytest.raises(ValueError, match=message):
        parse_caption(caption)


def test_parsed_checks_match_the_attribute_records_of_random_scenes():
    relations_seen = 0
    for i in range(400):
        attributes = sample_scene(np.random.default_rng([5, i]))
        checks = parse_caption(write_caption(attributes))
        groups = attributes["groups"]
        expected = []
        for group in groups:
            colour, shape = group["colour"], group["shape"]
            expected += [
                Check("object", colour, shape),
                Check("count", colour, shape, count=group["count"]),
                Check("colour", colour),
            ]
        for relation in attributes["relations"]:
            subject, other = groups[relation["subject"]], groups[relation["object"]]
            expected.append(
                Check(
                    "relation",
                    subject["colour"],
                    subject["shape"],
                    relation=relation["relation"],
                    other=(other["colour"], other["shape"]),
                )
            )
            relations_seen += 1
        assert checks == expected, write_caption(attributes)
    assert relations_seen > 50


def test_relation_rule_is_the_caption_rule_relaxed():
    left = torch.tensor([0.2, 0.5])
    assert relation_holds(left, torch.tensor([0.7, 0.5]), "left of")
    assert relation_holds(torch.tensor([0.7, 0.5]), left, "right of")
    assert not relation_holds(left, torch.tensor([0.7, 0.5]), "right of")
    assert relation_holds(torch.tensor([0.5, 0.1]), torch.tensor([0.5, 0.6]), "above")
    assert relation_holds(torch.tensor([0.5, 0.6]), torch.tensor([0.5, 0.1]), "below")
    near = torch.tensor([0.5 + RELATION_CHECK_OFFSET * 0.9, 0.5])
    assert not relation_holds(torch.tensor([0.5, 0.5]), near, "left of")  # too close
    assert not relation_holds(torch.tensor([0.2, 0.2]), torch.tensor([0.5, 0.6]), "left of")  # mostly above


def test_oracle_scores_one_on_real_scenes_and_less_on_wrong_captions():
    scenes = [render_scene(seed=9, index=i, size=32) for i in range(24)]
    images = torch.zeros(len(scenes), 3, 32, 32)  # the oracle never looks at pixels
    captions = [caption for _, caption, _ in scenes]
    records = [attributes for _, _, attributes in scenes]
    assert torch.equal(score(Oracle(records), images, captions), torch.ones(len(scenes)))

    shifted = captions[1:] + captions[:1]  # every image gets another scene's caption
    wrong = score(Oracle(records), images, shifted)
    assert wrong.max() < 1.0 and wrong.mean() < 0.5

    group = records[0]["groups"][0]
    recounted = {**records[0], "groups": [{**group, "count": group["count"] % 4 + 1}], "relations": []}
    miscounted = score(Oracle(records[:1]), images[:1], [write_caption(recounted)])
    assert miscounted.item() == pytest.approx(2 / 3)  # object and colour still pass, the count does not

    flipped = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
    i = next(i for i, record in enumerate(records) if record["relations"])
    relation = records[i]["relations"][0]
    wrong_relation = write_caption(
        {**records[i], "relations": [{**relation, "relation": flipped[relation["relation"]]}]}
    )
    total = len(parse_caption(wrong_relation))
    result = score(Oracle(records[i : i + 1]), images[i : i + 1], [wrong_relation])
    assert result.item() == pytest.approx((total - 1) / total)
    with pytest.raises(ValueError, match="2 images but 1 captions"):
        score(Oracle(records[:2]), images[:2], captions[:1])


def test_kind_scores_split_a_prompt_score_by_check_kind():
    counts = torch.zeros(1, len(PAIRS), dtype=torch.long)
    counts[0, PAIR_INDEX[("red", "circle")]] = 2  # two red circles where one is asked for: count fails
    counts[0, PAIR_INDEX[("blue", "star")]] = 1  # a blue star where a blue square is asked for
    centroids = torch.zeros(1, len(PAIRS), 2)
    caption = "a red circle left of a blue square on a noisy background"
    results = check_results(counts, centroids, [caption])
    assert kind_scores(results) == [{"object": 0.5, "count": 0.0, "colour": 1.0, "relation": 0.0}]
    results = check_results(counts, centroids, ["a red circle on a noisy background"])
    assert kind_scores(results) == [{"object": 1.0, "count": 0.0, "colour": 1.0}]  # no relation stated


def test_colour_check_counts_any_shape_of_that_colour():
    counts = torch.zeros(1, len(PAIRS), dtype=torch.long)
    counts[0, PAIR_INDEX[("red", "star")]] = 1
    oracle = type("Fixed", (), {"predict": lambda self, images: (counts, torch.zeros(1, len(PAIRS), 2))})()
    result = score(oracle, torch.zeros(1, 3, 32, 32), ["a red circle on a noisy background"])
    assert result.item() == pytest.approx(1 / 3)  # colour passes; object and count fail


def test_background_check_is_scored_beside_the_prompt_score():
    caption = "two red circles left of a blue star on a striped background"
    assert background_check(caption) == Check(BACKGROUND, background="striped")
    assert all(check.kind != BACKGROUND for check in parse_caption(caption))
    with pytest.raises(ValueError, match="unknown background 'plaid'"):
        background_check("a red circle on a plaid background")
    counts = torch.zeros(2, len(PAIRS), dtype=torch.long)
    counts[:, PAIR_INDEX[("red", "circle")]] = 1  # one red circle where two are asked for: count fails
    centroids = torch.zeros(2, len(PAIRS), 2)
    captions = [caption, "a red circle on a noisy background"]
    read = torch.tensor([BACKGROUNDS.index("striped"), BACKGROUNDS.index("gradient")])
    plain = check_results(counts, centroids, captions)
    results = check_results(counts, centroids, captions, backgrounds=read)
    assert [checks[-1] for checks in results] == [
        (Check(BACKGROUND, background="striped"), True),
        (Check(BACKGROUND, background="noisy"), False),
    ]
    assert [checks[:-1] for checks in results] == plain
    assert torch.equal(prompt_scores(results), prompt_scores(plain))  # the four kinds only, as before
    assert prompt_scores(results).tolist() == pytest.approx([2 / 7, 1.0])
    assert kind_scores(results) == [
        {"object": 0.5, "count": 0.0, "colour": 0.5, "relation": 0.0, "background": 1.0},
        {"object": 1.0, "count": 1.0, "colour": 1.0, "background": 0.0},
    ]
    assert all(BACKGROUND not in kinds for kinds in kind_scores(plain))
    with pytest.raises(ValueError, match=r"read kinds \[B\] of the 2 images, got shape \(2, 4\)"):
        check_results(counts, centroids, captions, backgrounds=torch.zeros(2, 4))
