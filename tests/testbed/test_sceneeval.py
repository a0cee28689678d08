import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
import torch
from hydra import compose, initialize_config_dir
from mulo_sd.training.config import CONFIG_DIR
from mulo_sd.training.sceneeval_module import SceneEvalBackgroundLightning, SceneEvalLightning
from mulo_sd.training.train import run
from omegaconf import OmegaConf
from safetensors.torch import load_file, save_file

from mulo_sd.nets.io import CONFIG_KEY
from mulo_sd.nets.vq import VQModel
from mulo_sd.testbed.scene_truth import PAIR_INDEX, PAIRS, background_targets, batch_targets, density_targets
from mulo_sd.testbed.sceneeval import (
    SceneEval,
    SceneEvalConfig,
    frechet_distance,
    frechet_distance_from_moments,
    scene_features,
)
from mulo_sd.testbed.synthscenes import BACKGROUNDS, COLOURS, SHAPES, sample_scene
from tests.helpers import tiny_vq

TINY_NET = {"image_size": 32, "patch": 4, "channels": [8, 16]}


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


SHIPPED = Path(__file__).resolve().parents[2] / "mulo_sd" / "assets" / "testbed" / "sceneeval"
# sha256 over (name, dtype, shape, bytes) of every tensor of the shipped SceneEval before its background head
# was trained (38 tensors: backbone and density head, BatchNorm statistics included)
TRUNK_SHA256 = "c879d066ed067bda9b20298a3a766b3cf851f61ce905b43176ad0b8a96af7321"


def state_sha256(state: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].contiguous()
        digest.update(f"{name}:{tensor.dtype}:{list(tensor.shape)}".encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


def test_background_head_reads_the_stem_and_stays_out_of_the_trunk():
    model = SceneEval(SceneEvalConfig(**TINY_NET, background_channels=8)).eval()
    images = torch.rand(3, 3, 64, 64, generator=torch.Generator().manual_seed(0)) * 2 - 1
    assert model.background_logits(images).shape == (3, len(BACKGROUNDS))
    kinds = model.predict_background(images)
    assert kinds.dtype == torch.long and kinds.shape == (3,) and ((kinds >= 0) & (kinds < 4)).all()
    trunk = model.trunk_state_dict()
    assert set(model.state_dict()) - set(trunk) == {k for k in model.state_dict() if "background_head" in k}
    assert set(trunk) == set(SceneEval(SceneEvalConfig(**TINY_NET)).state_dict())


def write_headless_file(folder: Path) -> SceneEval:
    """A SceneEval folder as saved before the background head existed: no background_channels anywhere."""
    model = SceneEval(SceneEvalConfig(**TINY_NET))
    model.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    del config["background_channels"]
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    weights = folder / "model.safetensors"
    save_file(load_file(weights), weights, metadata={CONFIG_KEY: json.dumps(config)})
    return model


def test_files_saved_before_the_head_load_without_it(tmp_path):
    saved = write_headless_file(tmp_path / "old")
    loaded = SceneEval.from_pretrained(tmp_path / "old")
    assert loaded.config.background_channels == 0 and not hasattr(loaded, "background_head")
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)) * 2 - 1
    assert torch.equal(scene_features(loaded, images), scene_features(saved.eval(), images))
    with pytest.raises(ValueError, match="no background head"):
        loaded.predict_background(images)


def test_shipped_file_keeps_the_trunk_it_had_before_the_head():
    state = load_file(SHIPPED / "model.safetensors")
    trunk = {name: tensor for name, tensor in state.items() if not name.startswith("background_head.")}
    assert len(trunk) == 38 and state_sha256(trunk) == TRUNK_SHA256
    model = SceneEval.from_pretrained(SHIPPED)
    assert model.config.background_channels > 0 and len(state) > len(trunk)


def background_run_overrides(tmp_path, init_from: Path) -> list[str]:
    common = [o for o in dev_run_overrides(tmp_path) if not o.startswith(("experiment=", "model.net."))]
    return [
        "experiment=testbed/sceneeval_background",
        *common,
        f"model.init_from={init_from}",
        "model.net.background_channels=8",
    ]


def test_dev_background_run_trains_only_the_head(tmp_path):
    trained = SceneEval(SceneEvalConfig(**TINY_NET))
    trained(torch.rand(4, 3, 32, 32) * 2 - 1)  # BatchNorm statistics that a trunk in train mode would move
    trained.save_pretrained(tmp_path / "trained")
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=background_run_overrides(tmp_path, tmp_path / "trained"))
    metrics = run(cfg)
    for name in ("val/background_acc", "val/background_acc_vq", "train/background_acc"):
        assert 0.0 <= metrics[name] <= 1.0
    assert metrics["train/loss"] > 0
    exported = SceneEval.from_pretrained(tmp_path / "export")
    assert exported.config == SceneEvalConfig(**TINY_NET, background_channels=8)
    before, after = trained.state_dict(), exported.trunk_state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    fresh = SceneEval(exported.config).background_head.state_dict()
    assert any(not torch.equal(v, fresh[k]) for k, v in exported.background_head.state_dict().items())


def test_background_module_freezes_the_trunk_and_reads_record_kinds(tmp_path):
    write_headless_file(tmp_path / "old")
    module = SceneEvalBackgroundLightning(
        init_from=str(tmp_path / "old"),
        net=OmegaConf.create({"background_channels": 8}),
        loss=OmegaConf.create({"label_smoothing": 0.0}),
        optim=OmegaConf.create({}),
    )
    module.train()
    assert not module.model.training and module.model.background_head.training
    head = {id(p) for p in module.model.background_head.parameters()}
    assert {id(p) for p in module.parameters() if p.requires_grad} == head
    assert {id(p) for p in module.trained_parameters()} == head
    records = [sample_scene(np.random.default_rng([7, i])) for i in range(6)]
    kinds = background_targets(records)
    assert kinds.tolist() == [BACKGROUNDS.index(r["background"]["kind"]) for r in records]
    with pytest.raises(ValueError, match="background_channels must be > 0"):
        SceneEvalBackgroundLightning(
            init_from=str(tmp_path / "old"),
            net=OmegaConf.create({"background_channels": 0}),
            loss=OmegaConf.create({"label_smoothing": 0.0}),
            optim=OmegaConf.create({}),
        )
