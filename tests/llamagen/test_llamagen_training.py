"""`experiment=llamagen/*` on img2dataset-style shards (jpg + txt + json) with the tiny converted LlamaGen
set: the samplers train over the official VQ's codebook, validate (the acceptance metric under the
T5-conditioned target included) and export into the set, which `mulo-decode` and `mulo-eval` then use."""

from __future__ import annotations

import csv
import io
import json

import pytest
from mulo_sd.data.shards import write_shards
from mulo_sd.training.decode import run as decode_run
from mulo_sd.training.evaluate import run as eval_run
from mulo_sd.training.train import run as train_run
from PIL import Image

from mulo_sd.nets.upsampler import Upsampler
from mulo_sd.testbed.synthscenes import render_scene
from tests.helpers import compose_train_config
from tests.llamagen_fixtures import DRAFTER_SIZE, FOLDERS, TARGET_SIZE, set_overrides, write_llamagen_set
from tests.training.test_decode_cli import compose

TAUS = (0.01, 0.05, 0.1)


def img2dataset_samples(seed: int, count: int):
    """Samples as img2dataset writes them: a JPEG (not square), its caption and its json record."""
    for index in range(count):
        image, caption, _ = render_scene(seed, index, 96)
        image = image.crop((0, 8, 96, 88))  # 96 x 80: the datamodule centre-crops
        data = io.BytesIO()
        image.save(data, format="JPEG", quality=90)
        record = {"url": f"https://example.com/{index}.jpg", "caption": caption, "key": f"{index:09d}",
                  "status": "success", "width": 96, "height": 80}  # fmt: skip
        yield {"__key__": f"{index:09d}", "jpg": data.getvalue(), "txt": caption.encode(),
               "json": json.dumps(record).encode()}  # fmt: skip


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The converted set without samplers, and train / val shards."""
    base = tmp_path_factory.mktemp("llamagen_training")
    root = write_llamagen_set(base / "ckpts", samplers=False)
    write_shards(img2dataset_samples(1, 8), str(base / "train"), "laion", shard_size=4)
    write_shards(img2dataset_samples(2, 4), str(base / "val"), "laion", shard_size=4)
    return {
        "base": base,
        "root": root,
        "train": str(base / "train" / "laion-{000000..000001}.tar"),
        "val": str(base / "val" / "laion-000000.tar"),
    }


def tiny_run(world, experiment: str, *extra: str, images: bool = True) -> list[str]:
    """A few-step CPU run of `experiment` at 64 px (target) / 32 px (drafter) on the tiny shards; `images`:
    the low-res image too (False: pre-tokenised shards)."""
    return [
        f"experiment=llamagen/{experiment}", f"llamagen.root={world['root']}", "trainer=cpu",
        f"data.train_shards='{world['train']}'", f"data.val_shards={world['val']}",
        f"data.image_size={TARGET_SIZE}", f"data.extra_sizes=[{DRAFTER_SIZE if images else ''}]",
        "data.batch_size=4", "data.val_samples=4", "data.num_workers=0", "data.shuffle_buffer=8",
        "data.train_samples_per_epoch=8", "model.sampler.width=16", "model.sampler.blocks=1",
        "trainer.max_steps=2", "trainer.val_check_interval=2",
        "callbacks.checkpoint.every_n_train_steps=2",
        "loss.lpips.net=alex", "loss.lpips.pretrained_backbone=false",  # no ImageNet weights here
        *extra,
    ]  # fmt: skip


def test_train_export_decode_and_evaluate_on_the_llamagen_set(world, tmp_path):
    root = world["root"]
    up = train_run(
        compose_train_config(
            tmp_path / "up", tiny_run(world, "upsampler_r2", f"export={root / FOLDERS['upsampler_r2']}")
        )
    )
    for tau in TAUS:  # the T5-conditioned target's acceptance of the up-sampled drafts, a rate
        assert 0.0 <= up[f"val/accept@{tau}"] <= 1.0
    assert up["val/accept@0.01"] >= up["val/accept@0.1"] and up["val/acc"] >= 0.0
    exported = Upsampler.from_pretrained(root / FOLDERS["upsampler_r2"])
    assert exported.r == 2 and exported.codebook_size == 64 and exported.code_dim == 8
    down = train_run(
        compose_train_config(
            tmp_path / "down", tiny_run(world, "downsampler_r2", f"export={root / FOLDERS['downsampler_r2']}")
        )
    )
    assert "val/acc" in down and not any(name.startswith("val/accept") for name in down)

    out = tmp_path / "mulo.png"
    stats = decode_run(
        compose("decode", tmp_path, set_overrides(root, "method=mulo", f"out={out}", "prompt='a red star'"))
    )
    assert Image.open(out).size == (TARGET_SIZE, TARGET_SIZE) and stats["upsampler_calls"] >= 1

    eval_dir = tmp_path / "eval"
    overrides = set_overrides(root, "eval=llamagen", "prompts.count=2", "grid_prompts=2", "warmup=0",
                              "progress=false", f"out_dir={eval_dir}")  # fmt: skip
    result = eval_run(compose("evaluate", tmp_path, overrides))
    with open(eval_dir / "summary.csv") as f:
        summary = list(csv.DictReader(f))
    labels = [row["label"] for row in summary]
    assert labels == [
        "AR",
        "ZipAR window=4",
        "MuLo-SD (2x) tau=0.001",
        "MuLo-SD (2x) tau=0.01",
        "MuLo-SD (2x) tau=0.05",
    ]
    assert all(float(row["nll_mean"]) > 0 and "sceneeval" not in row for row in summary)  # no SceneEval here
    assert (eval_dir / "summary.md").is_file() and (eval_dir / "grid_seed0.png").is_file()
    assert result.matched is None


def test_stored_t5_rows_and_the_t5_folder_give_the_same_acceptance(world, tmp_path):
    """Validation only, of the pixel-space up-sampler (no weights, so no seed matters): image shards + the T5
    folder vs pre-tokenised shards (VQ grids and t5.npy rows made on demand) give the same metrics."""
    common = ["validate_first=true", "trainer.max_steps=0", "model.pixel=bicubic"]
    raw = train_run(compose_train_config(tmp_path / "raw", tiny_run(world, "upsampler_r2", *common)))
    tokens = [
        "data=laion_coco_aesthetic_tokens", "data.token_keys=[tok4,tok2]", "+data.token_shapes.tok4=[4,4]",
        "+data.token_shapes.tok2=[2,2]",
        f"data.pretokenize.sizes=[{TARGET_SIZE},{DRAFTER_SIZE}]", "data.pretokenize.device=cpu",
        "model.acceptance.text_encoder=null",  # the stored rows must be what the metric reads
    ]  # fmt: skip
    stored = train_run(
        compose_train_config(
            tmp_path / "tokens", tiny_run(world, "upsampler_r2", *common, *tokens, images=False)
        )
    )
    assert 0 < raw["val/accept@0.01"] < 1  # the metric can tell the two apart
    for name in ("val/acc", *(f"val/accept@{tau}" for tau in TAUS)):
        assert stored[name] == pytest.approx(raw[name], abs=1e-6), name


@pytest.mark.parametrize("loss", ["mse_lpips", "mse_lpips_gan"])
def test_the_pixel_loss_rows_train_through_the_official_decoder(world, tmp_path, loss):
    metrics = train_run(
        compose_train_config(tmp_path, tiny_run(world, "upsampler_r2", f"loss={loss}", "loss.gan.start=0"))
    )
    assert metrics["train/mse"] > 0 and metrics["train/lpips"] > 0 and 0 <= metrics["val/accept@0.01"] <= 1
    assert ("train/adv" in metrics) == (loss == "mse_lpips_gan")


@pytest.mark.parametrize(
    ("experiment", "r", "low"),
    [
        ("upsampler_r2", 2, 256),
        ("upsampler_r4", 4, 128),
        ("downsampler_r2", 2, 256),
        ("downsampler_r4", 4, 128),
    ],
)
def test_the_experiments_read_their_folders_from_llamagen_root(tmp_path, experiment, r, low):
    cfg = compose_train_config(tmp_path, [f"experiment=llamagen/{experiment}", "llamagen.root=/ckpts"])
    assert cfg.model.r == r and list(cfg.data.extra_sizes) == [low] and cfg.data.image_size == 512
    assert cfg.model.tokenizer == "/ckpts/vq_ds16_t2i" and cfg.trainer.precision == "bf16-mixed"
    if experiment.startswith("up"):
        assert cfg.model.target == "/ckpts/t2i_XL_stage2_512"
        assert cfg.model.acceptance.text_encoder == "/ckpts/flan-t5-xl"
        assert dict(cfg.model.acceptance.sampler) == {
            "temperature": 1.0,
            "top_k": 1000,
            "top_p": 1.0,
            "cfg_scale": 7.5,
        }
