import numpy as np
import pytest
import scipy.linalg
import torch
from hydra import compose, initialize_config_dir
from mulo_sd.training.config import CONFIG_DIR
from mulo_sd.training.sceneeval_module import SceneEvalLightning
from mulo_sd.training.train import run
from omegaconf import OmegaConf

from mulo_sd.nets.vq import VQModel
from mulo_sd.testbed.sceneeval import (
    PAIR_INDEX,
    PAIRS,
    RELATION_CHECK_OFFSET,
    Check,
    SceneEval,
    SceneEvalConfig,
    batch_targets,
    check_results,
    density_targets,
    frechet_distance,
    frechet_distance_from_moments,
    kind_scores,
    parse_caption,
    relation_holds,
    scene_features,
    score,
)
from mulo_sd.testbed.synthscenes import COLOURS, SHAPES, render_scene, sample_scene, write_caption
from tests.helpers import tiny_vq

TINY_NET = {"image_size": 32, "patch": 4, "channels": [8, 16]}


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


def test_density_targets_sum_to_counts_and_peak_at_the_objects():
    records = [sample_scene(np.random.default_rng([6, i])) for i in range(20)]
    maps = density_targets(records, grid=8)
    counts, _, _ = batch_targets(records)
    assert maps.shape == (20, len(PAIRS), 8, 8)
    assert torch.allclose(maps.sum((2, 3)), counts.float(), atol=1e-5)
    for b, record in enumerate(records):
        for group in record["groups"]:
            if group["count"] == 1:
                peak = int(maps[b, PAIR_INDEX[(group["colour"], group["shape"])]].argmax())
                x, y = group["centroid"]
                assert peak == min(int(y * 8), 7) * 8 + min(int(x * 8), 7)


def test_model_reads_any_size_and_rejects_other_shapes():
    model = SceneEval(SceneEvalConfig(**TINY_NET)).eval()
    for size in (32, 16, 64):
        out = model(torch.zeros(2, 3, size, size))
        assert out["density"].shape == (2, len(COLOURS) * len(SHAPES), 4, 4) and model.grid == 4
        assert torch.allclose(out["counts"], out["density"].sum((2, 3)))
        assert out["centroids"].shape == (2, len(PAIRS), 2)
        assert out["features"].shape == (2, 16) and model.feature_dim == 16
        assert ((out["centroids"] >= 0) & (out["centroids"] <= 1)).all()
    with pytest.raises(ValueError, match="square images"):
        model(torch.zeros(2, 3, 32, 16))
    with pytest.raises(ValueError, match="divisible by the total stride 8"):
        SceneEvalConfig(image_size=36, patch=4, channels=[8, 16])


def test_frechet_distance_identical_sets_is_zero():
    features = torch.randn(200, 16, generator=torch.Generator().manual_seed(0))
    assert frechet_distance(features, features) == pytest.approx(0.0, abs=1e-8)
    assert frechet_distance(features, features + 1.0) == pytest.approx(16.0, rel=1e-8)


def exact_gaussian_sample(mean, cov, n, seed):
    """n points whose sample mean and (unbiased) covariance are exactly `mean` and `cov`."""
    x = np.random.default_rng(seed).normal(size=(n, len(mean)))
    x -= x.mean(0)
    x = x @ np.linalg.inv(np.linalg.cholesky(np.cov(x, rowvar=False))).T  # whitened: covariance I
    return x @ np.linalg.cholesky(cov).T + mean


def test_frechet_distance_matches_closed_form_for_gaussians():
    rotation, _ = np.linalg.qr(np.random.default_rng(1).normal(size=(4, 4)))
    var_a, var_b = np.array([1.0, 2.0, 0.5, 3.0]), np.array([4.0, 1.0, 0.5, 0.25])
    mean_a, mean_b = np.array([0.0, 1.0, 2.0, 3.0]), np.array([1.0, 1.0, 0.0, 3.0])
    cov_a, cov_b = (rotation * var_a) @ rotation.T, (rotation * var_b) @ rotation.T  # commuting pair
    closed_form = np.sum((mean_a - mean_b) ** 2) + np.sum((np.sqrt(var_a) - np.sqrt(var_b)) ** 2)
    a = exact_gaussian_sample(mean_a, cov_a, 300, seed=2)
    b = exact_gaussian_sample(mean_b, cov_b, 500, seed=3)
    assert frechet_distance(torch.from_numpy(a), b) == pytest.approx(closed_form, rel=1e-9)

    # a non-commuting pair against the textbook formula with a general matrix square root
    m = np.random.default_rng(4).normal(size=(2, 5, 5))
    cov_a, cov_b = m[0] @ m[0].T + 0.1 * np.eye(5), m[1] @ m[1].T + 0.1 * np.eye(5)
    textbook = np.trace(cov_a + cov_b - 2 * scipy.linalg.sqrtm(cov_a @ cov_b).real) + 1.0
    moments = frechet_distance_from_moments(np.zeros(5), cov_a, np.eye(5)[0], cov_b)
    assert moments == pytest.approx(textbook, rel=1e-8)


def test_frechet_distance_rejects_mismatched_sets():
    with pytest.raises(ValueError, match="same F and N >= 2"):
        frechet_distance(np.zeros((10, 4)), np.zeros((10, 5)))
    with pytest.raises(ValueError, match="same F and N >= 2"):
        frechet_distance(np.zeros((1, 4)), np.zeros((10, 4)))


def test_export_round_trip_gives_identical_features(tmp_path):
    module = SceneEvalLightning(
        net=OmegaConf.create(TINY_NET),
        loss=OmegaConf.create({"density_weight": 1.0, "centroid_weight": 10.0}),
        optim=OmegaConf.create({}),
    )
    images = torch.rand(8, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1
    module.model.train()
    module.model(images)  # moves the BatchNorm running statistics away from their initial values
    module.model.eval()
    loaded = SceneEval.from_pretrained(module.export(tmp_path / "sceneeval"))
    assert loaded.config == module.model.config
    assert torch.equal(scene_features(loaded, images, batch_size=3), scene_features(module.model, images))
    with pytest.raises(ValueError, match="holds a 'sceneeval' model, not a 'vq' model"):
        VQModel.from_pretrained(tmp_path / "sceneeval")


def dev_run_overrides(tmp_path) -> list[str]:
    return [
        "experiment=testbed/sceneeval",
        f"paths.data_dir={tmp_path}/shards",
        f"paths.output_dir={tmp_path}/run",
        f"export={tmp_path}/export",
        "logger=csv",
        "data.image_size=32",
        "data.batch_size=8",
        "data.train_samples_per_epoch=16",
        "data.val_samples=16",
        "data.num_workers=0",
        "data.shuffle_buffer=8",
        "data.generate.train.count=32",
        "data.generate.val.count=16",
        "model.net.image_size=32",
        "model.net.channels=[8,16]",
        "model.optim.warmup_steps=1",
        "trainer.max_steps=3",
        "trainer.val_check_interval=3",
        "trainer.log_every_n_steps=1",
        "trainer.enable_progress_bar=false",
        "+trainer.enable_model_summary=false",
        "callbacks.checkpoint.every_n_train_steps=3",
    ]


def test_dev_training_run_logs_validation_and_exports(tmp_path):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=dev_run_overrides(tmp_path))
    metrics = run(cfg)
    assert 0.0 <= metrics["val/score"] <= 1.0
    assert 0.0 <= metrics["val/score_vq"] <= 1.0  # the real images' tokenizer round trips, scored too
    for kind in ("object", "count", "colour"):
        assert 0.0 <= metrics[f"val/acc_{kind}"] <= 1.0
    assert metrics["train/density_loss"] > 0 and metrics["train/centroid_loss"] > 0
    model = SceneEval.from_pretrained(tmp_path / "export")
    assert model.config.channels == [8, 16] and model.config.image_size == 32


@pytest.mark.slow
def test_two_process_cpu_ddp_sums_validation_over_ranks(tmp_path):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[*dev_run_overrides(tmp_path), "trainer=ddp_cpu"])
    metrics = run(cfg)
    assert 0.0 <= metrics["val/score"] <= 1.0 and 0.0 <= metrics["val/score_vq"] <= 1.0
    assert SceneEval.from_pretrained(tmp_path / "export").config.channels == [8, 16]


def test_round_trip_training_needs_a_tokenizer_and_uses_it(tmp_path):
    common = {"net": OmegaConf.create(TINY_NET), "loss": OmegaConf.create({}), "optim": OmegaConf.create({})}
    with pytest.raises(ValueError, match="reconstruct_prob > 0 needs a tokenizer"):
        SceneEvalLightning(**common, reconstruct_prob=0.5)
    with pytest.raises(ValueError, match=r"reconstruct_prob must lie in \[0, 1\], got 1.5"):
        SceneEvalLightning(**common, tokenizer="unused", reconstruct_prob=1.5)
    vq = tiny_vq(0, 32, (1, 2, 2, 4))
    vq.save_pretrained(tmp_path / "vq")
    module = SceneEvalLightning(**common, tokenizer=str(tmp_path / "vq"), reconstruct_prob=1.0)
    assert not any(k.startswith("tokenizer") for k in module.state_dict())  # not saved with SceneEval
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        expected = vq.decode(vq.encode(images)).clamp(-1, 1)
    assert torch.equal(module.round_trip(images), expected)
