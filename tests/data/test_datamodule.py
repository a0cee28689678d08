import io
import json
import pickle
import resource
import threading
import time
import warnings
from types import SimpleNamespace

import hydra
import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import webdataset as wds
from mulo_sd.training.ar_module import ARLightning
from mulo_sd.training.datamodule import ShardDataModule
from mulo_sd.training.eagle_module import EagleLightning
from mulo_sd.training.sample_decoding import skipped_total
from mulo_sd.training.sampler_module import SamplerLightning
from mulo_sd.training.vq_module import VQLightning
from PIL import Image, ImageFile

from tests.helpers import compose_train_config

IMAGE_SIZE = 16


def png(index: int) -> bytes:
    """64x32 image: red stripes at the left/right edges (the centre crop cuts them), noise between."""
    rng = np.random.default_rng(index)
    pixels = np.zeros((32, 64, 3), dtype=np.uint8)
    pixels[:, 8:56, 1:] = rng.integers(0, 256, size=(32, 48, 2))
    pixels[:, :8, 0] = pixels[:, 56:, 0] = 255
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def sample(index: int, prefix: str = "s") -> dict:
    return {
        "__key__": f"{prefix}{index:04d}",
        "png": png(index),
        "txt": f"caption {index}\n",
        "json": json.dumps({"index": index}).encode(),
        "tok4.npy": npy(np.full((4, 4), index, dtype=np.int32)),
    }


def write_shard(path, samples):
    with wds.TarWriter(str(path)) as sink:
        for item in samples:
            sink.write(item)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    for shard in range(2):
        write_shard(root / f"good-{shard:06d}.tar", [sample(6 * shard + i) for i in range(6)])
    bad = [sample(i, prefix="b") for i in range(6)]
    bad[1]["png"] = b"this is not a png"
    del bad[2]["png"]
    bad[3]["json"] = b"{not json"
    bad[4]["tok4.npy"] = npy(np.zeros((3, 3), dtype=np.int32))
    write_shard(root / "bad.tar", bad)
    write_shard(root / "truncated.tar", [sample(i, prefix="t") for i in range(6)])
    data = (root / "truncated.tar").read_bytes()
    (root / "truncated.tar").write_bytes(data[: len(data) // 2])
    return root


def make(shards, **overrides):
    args = dict(
        train_shards=f"{shards}/good-{{000000..000001}}.tar",
        val_shards=f"{shards}/good-{{000000..000001}}.tar",
        image_size=IMAGE_SIZE,
        batch_size=4,
        train_samples_per_epoch=16,
        shuffle_buffer=8,
        seed=3,
    )
    return ShardDataModule(**{**args, **overrides})


def keys(batches):
    return [key for batch in batches for key in batch["key"]]


def test_batch_fields_shapes_and_values(shards):
    dm = make(shards, extra_sizes=[8, 4], token_keys=["tok4.npy"], token_shapes={"tok4": [4, 4]})
    batches = list(dm.train_dataloader())
    assert len(batches) == 4
    batch = batches[0]
    assert batch["image"].shape == (4, 3, IMAGE_SIZE, IMAGE_SIZE) and batch["image"].dtype == torch.float32
    assert batch["image"].min() >= -1 and batch["image"].max() <= 1 and batch["image"].std() > 0.3
    assert (batch["image"][:, 0] == -1).all(), "the centre crop must cut off the red edge stripes"
    for px in (8, 4):
        expected = F.interpolate(batch["image"], size=px, mode="area")
        assert batch[f"image_{px}"].shape == (4, 3, px, px)
        assert torch.allclose(batch[f"image_{px}"], expected, atol=1.01 / 127.5)
    indices = [int(key[1:]) for key in batch["key"]]
    assert batch["tok4"].dtype == torch.int64 and batch["tok4"].shape == (4, 4, 4)
    assert batch["tok4"][:, 0, 0].tolist() == indices
    assert batch["caption"] == [f"caption {i}" for i in indices]
    assert batch["attributes"] == [{"index": i} for i in indices]
    assert batch["skipped"].item() == 0 and skipped_total(batches) == 0


def test_missing_caption_and_json_give_empty_values(tmp_path):
    item = sample(0)
    del item["txt"], item["json"]
    write_shard(tmp_path / "plain.tar", [item])
    dm = ShardDataModule(f"{tmp_path}/plain.tar", IMAGE_SIZE, 1, 1, val_shards=f"{tmp_path}/plain.tar")
    (batch,) = list(dm.val_dataloader())
    assert batch["caption"] == [""] and batch["attributes"] == [{}]


def test_corrupt_and_incomplete_samples_are_skipped_and_counted(shards):
    dm = make(
        shards,
        val_shards=f"{shards}/bad.tar",
        batch_size=1,
        token_keys=["tok4"],
        token_shapes={"tok4": [4, 4]},
    )
    with pytest.warns(UserWarning, match="skipped sample 'b0001'.*UnidentifiedImageError"):
        batches = list(dm.val_dataloader())
    assert keys(batches) == ["b0000", "b0005"]
    assert batches[-1]["skipped"].item() == 4 and skipped_total(batches) == 4

    train = make(
        shards,
        train_shards=f"{shards}/bad.tar",
        batch_size=2,
        token_keys=["tok4"],
        token_shapes={"tok4": [4, 4]},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batches = list(train.train_dataloader())
    assert len(batches) == 8 and set(keys(batches)) == {"b0000", "b0005"}
    assert batches[-1]["skipped"].item() > 0


def test_token_grids_without_images(shards):
    dm = make(
        shards,
        val_shards=f"{shards}/bad.tar",
        load_images=False,
        token_keys=["tok4.npy"],
        token_shapes={"tok4": [4, 4]},
    )
    with pytest.warns(UserWarning, match="tok4.npy is int32 \\(3, 3\\)"):
        (batch,) = list(dm.val_dataloader())
    assert "image" not in batch
    assert batch["key"] == ["b0000", "b0001", "b0002", "b0005"]  # bad/missing png do not matter here
    assert batch["tok4"].shape == (4, 4, 4) and batch["skipped"].item() == 2


def test_truncated_tar_is_tolerated(shards):
    dm = make(shards, val_shards=f"{shards}/truncated.tar::{shards}/good-000000.tar")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = keys(dm.val_dataloader())
    assert found[-6:] == [f"s{i:04d}" for i in range(6)]
    assert 0 < len(found) - 6 < 6 and all(key.startswith("t") for key in found[:-6])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_validation_set_is_fixed(shards, num_workers):
    dm = make(shards, val_samples=10, num_workers=num_workers)
    first, second = list(dm.val_dataloader()), list(dm.val_dataloader())
    assert keys(first) == keys(second)
    assert sorted(keys(first)) == [f"s{i:04d}" for i in range(10)]
    if num_workers == 0:
        assert keys(first) == [f"s{i:04d}" for i in range(10)]
        assert [len(batch["key"]) for batch in first] == [4, 4, 2]
    assert torch.equal(first[0]["image"], second[0]["image"])


def test_validation_split_over_ranks(shards):
    per_rank = [
        list(make(shards, val_samples=11, batch_size=2, rank=r, world_size=2).val_dataloader())
        for r in range(2)
    ]
    assert len(per_rank[0]) == len(per_rank[1]) == 3
    rank0, rank1 = keys(per_rank[0]), keys(per_rank[1])
    assert len(rank0) == len(rank1) == 5 and not set(rank0) & set(rank1)
    assert sorted(rank0 + rank1) == [f"s{i:04d}" for i in range(10)]


def test_training_stream_per_rank(shards):
    loaders = [
        make(shards, train_samples_per_epoch=24, rank=r, world_size=2).train_dataloader() for r in range(2)
    ]
    epochs = [[keys(loader), keys(loader)] for loader in loaders]
    assert len(loaders[0]) == len(loaders[1]) == 3  # ceil(24 / (4 * 2))
    assert all(len(epoch) == 12 for rank in epochs for epoch in rank)
    assert epochs[0][0] != epochs[1][0], "two ranks must see different samples"
    assert epochs[0][0] != epochs[0][1], "a new epoch must draw new samples"
    again = make(shards, train_samples_per_epoch=24, rank=0, world_size=2).train_dataloader()
    assert keys(again) == epochs[0][0], "the stream is deterministic for (seed, rank, worker, epoch)"


def test_epoch_length_arithmetic(shards):
    dm = make(shards, train_samples_per_epoch=100, batch_size=3, num_workers=4)
    # per rank ceil(100 / (3 * 2)) = 17 batches, per worker ceil(17 / 4) = 5, so 20 per rank
    assert dm.batches_per_worker(world_size=2) == 5 and dm.train_batches_per_epoch(world_size=2) == 20


def test_two_workers(shards):
    dm = make(shards, num_workers=2, batch_size=2)
    loader = dm.train_dataloader()
    first, second = list(loader), list(loader)
    assert len(loader) == len(first) == len(second) == 8  # 16 samples / 2 per batch, 4 per worker
    assert sorted(int(batch["worker"]) for batch in first) == [0] * 4 + [1] * 4
    by_worker = [keys(batch for batch in first if int(batch["worker"]) == w) for w in range(2)]
    assert by_worker[0] != by_worker[1]
    assert keys(first) != keys(second), "persistent workers must advance their epoch"


def test_pipelines_pickle(shards):
    dm = make(shards, extra_sizes=[8], token_keys=["tok4"], token_shapes={"tok4": [4, 4]}, val_samples=4)
    train = pickle.loads(pickle.dumps(dm.train_dataset(rank=1, world_size=2)))
    pickle.dumps(dm.val_dataset(rank=0, world_size=2))
    batch = next(iter(train))
    assert batch["image_8"].shape == (4, 3, 8, 8)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_replays_the_uninterrupted_stream(shards, num_workers):
    fresh = make(shards, num_workers=num_workers)
    assert fresh.state_dict() == {"train_batches_consumed": 0}
    loader = fresh.train_dataloader()
    uninterrupted = [keys([b]) for epoch in range(3) for b in loader]  # 3 epochs of 4 batches
    for consumed in (2, 4, 6):  # mid-epoch, at an epoch boundary, mid second epoch
        resumed = make(shards, num_workers=num_workers)
        resumed.load_state_dict({"train_batches_consumed": consumed})
        assert resumed.state_dict() == {"train_batches_consumed": consumed}
        replay = [keys([b]) for b in resumed.train_dataloader()]
        remaining = 4 - consumed % 4
        assert replay[:remaining] == uninterrupted[consumed : consumed + remaining]


class MeanImage(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(()))

    def training_step(self, batch, batch_idx):
        return (self.weight * batch["image"].mean()) ** 2

    def validation_step(self, batch, batch_idx):
        self.log("skipped", batch["skipped"].float(), batch_size=len(batch["key"]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_lightning_fit_and_checkpoint_state(shards, tmp_path):
    dm = make(shards, val_samples=4, train_samples_per_epoch=12)
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(MeanImage(), datamodule=dm)
    assert trainer.num_training_batches == 3
    assert dm.state_dict() == {"train_batches_consumed": 3}
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    checkpoint = torch.load(tmp_path / "last.ckpt", weights_only=False)
    assert checkpoint["ShardDataModule"] == {"train_batches_consumed": 3}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(extra_sizes=[16]), "strictly between 0 and image_size=16"),
        (
            dict(extra_sizes=[8], load_images=False, token_keys=["tok4"], token_shapes={"tok4": [4, 4]}),
            "need load_images=True",
        ),
        (dict(token_keys=["tok4.npy"]), "token_shapes must give the \\[h, w\\] grid of token key 'tok4'"),
        (dict(load_images=False), "nothing to load"),
        (dict(rank=2, world_size=2), "0 <= rank < world_size"),
        (dict(batch_size=0), "batch_size must be >= 1"),
        (dict(max_aspect_ratio=0.5), "max_pixels must be >= 1 and max_aspect_ratio >= 1"),
    ],
)
def test_bad_arguments(shards, overrides, message):
    with pytest.raises(ValueError, match=message):
        make(shards, **overrides)


def test_bad_shard_specs(shards):
    with pytest.raises(FileNotFoundError, match="1 of 2 shards .* do not exist, e.g. .*good-000002.tar"):
        make(shards, train_shards=f"{shards}/good-{{000001..000002}}.tar").train_dataloader()
    with pytest.raises(ValueError, match="set val_samples when running on more than one rank"):
        make(shards, rank=0, world_size=2).val_dataloader()
    assert make(shards, val_shards=None).val_dataloader() == []


def broken_shards(tmp_path, case):
    """Shards with no usable training sample: a 0-byte file and an empty tar, or samples without an image."""
    if case == "empty":
        (tmp_path / "zero.tar").write_bytes(b"")
        write_shard(tmp_path / "empty.tar", [])
        return ["zero.tar", "empty.tar"]
    write_shard(
        tmp_path / "captions.tar", [{"__key__": f"c{i:03d}", "txt": b"a caption"} for i in range(100)]
    )
    return ["captions.tar"]


@pytest.mark.parametrize(
    ("case", "num_workers"),
    # a worker's error reaches the main process; torch then takes 5 s to shut that worker down
    [("empty", 0), ("captions_only", 0), pytest.param("empty", 1, marks=pytest.mark.slow)],
)
def test_training_stream_without_usable_samples_raises(tmp_path, case, num_workers):
    names = broken_shards(tmp_path, case)
    dm = make(
        tmp_path, train_shards="::".join(f"{tmp_path}/{name}" for name in names), num_workers=num_workers
    )
    errors = []

    def first_batch():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                next(iter(dm.train_dataloader()))
            except RuntimeError as error:
                errors.append(str(error))

    # under the default limit the error comes within seconds; a thread keeps a regression from hanging pytest
    reader = threading.Thread(target=first_batch, daemon=True)
    reader.start()
    reader.join(timeout=60)
    assert errors, "the training stream spun on data without a usable sample instead of raising"
    assert "no usable training sample" in errors[0]
    assert all(f"{tmp_path}/{name}" in errors[0] for name in names)


def test_isolated_bad_shards_and_samples_do_not_stop_training(shards, tmp_path):
    (tmp_path / "zero.tar").write_bytes(b"")
    dm = make(shards, train_shards=f"{shards}/bad.tar::{tmp_path}/zero.tar", max_consecutive_failures=100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batches = list(dm.train_dataloader())
    assert len(batches) == 4 and set(keys(batches)) == {"b0000", "b0004", "b0005"}
    assert skipped_total(batches) > 0


def test_pipe_urls_need_allow_pipe(shards):
    spec = f"pipe:cat {shards}/good-000000.tar"
    for split in ("train", "val"):
        with pytest.raises(ValueError, match=f"shard spec '{spec}' has 1 pipe: URLs.*data.allow_pipe=true"):
            getattr(make(shards, **{f"{split}_shards": spec}), f"{split}_dataloader")()
    (batch,) = list(make(shards, val_shards=spec, allow_pipe=True, batch_size=6).val_dataloader())
    assert batch["key"] == [f"s{i:04d}" for i in range(6)]


def test_laion_config_refuses_pipe_specs_unless_allowed(shards, tmp_path):
    spec = f"pipe:cat {shards}/good-000000.tar"
    overrides = ["data=laion_coco_aesthetic", f"data.train_shards='{spec}'", "data.image_size=16"]
    overrides += ["data.batch_size=2", "data.num_workers=0", "data.shuffle_buffer=4"]
    refused = hydra.utils.instantiate(compose_train_config(tmp_path, overrides).data)
    assert refused.max_consecutive_failures == 20000
    with pytest.raises(ValueError, match="data.allow_pipe=true"):
        refused.train_dataloader()
    allowed = hydra.utils.instantiate(
        compose_train_config(tmp_path, [*overrides, "data.allow_pipe=true"]).data
    )
    assert next(iter(allowed.train_dataloader()))["image"].shape == (2, 3, IMAGE_SIZE, IMAGE_SIZE)


class CaptionedMeanImage(MeanImage):
    requires_captions = True  # as the AR GPT and EAGLE modules

    def training_step(self, batch, batch_idx):
        assert all(batch["caption"]), "a captionless sample reached a module that needs captions"
        return super().training_step(batch, batch_idx)


def attached(dm, module):
    """`dm` as trainer.fit attaches it to a trainer of `module` (a LightningModule class will do here)."""
    dm.trainer = SimpleNamespace(lightning_module=module, global_rank=0, world_size=1)
    return dm


def quiet_val_keys(dm):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return keys(dm.val_dataloader())


def test_captionless_samples_are_skipped_for_modules_that_need_captions(tmp_path):
    items = [sample(i) for i in range(4)]
    del items[1]["txt"]
    items[2]["txt"] = " \n"
    write_shard(tmp_path / "mixed.tar", items)
    spec = f"{tmp_path}/mixed.tar"
    everything, captioned = ["s0000", "s0001", "s0002", "s0003"], ["s0000", "s0003"]
    for module in [ARLightning, EagleLightning]:
        dm = attached(make(tmp_path, train_shards=spec, val_shards=spec), module)
        with pytest.warns(UserWarning, match=f"'s0001' of {spec}: ValueError: no caption \\(member 'txt'"):
            (batch,) = list(dm.val_dataloader())
        assert batch["key"] == captioned and batch["skipped"].item() == 2
    for module in [VQLightning, SamplerLightning]:  # they train without captions: "" is fine
        dm = attached(make(tmp_path, train_shards=spec, val_shards=spec), module)
        assert quiet_val_keys(dm) == everything, module
    for require, module, wanted in [(False, ARLightning, everything), (True, VQLightning, captioned)]:
        dm = make(tmp_path, train_shards=spec, val_shards=spec, require_captions=require)
        assert quiet_val_keys(attached(dm, module)) == wanted, (require, module)
    dm = make(tmp_path, train_shards=spec, val_shards=spec, require_captions=True)  # no trainer attached
    assert quiet_val_keys(dm) == captioned
    # a real fit: the training stream skips them and counts them in the skipped count (train/skipped_samples)
    dm = make(tmp_path, train_shards=spec, val_shards=None, batch_size=2, train_samples_per_epoch=4)
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(CaptionedMeanImage(), datamodule=dm)
        batches = list(dm.train_dataset(0, 1))
    assert set(keys(batches)) == set(captioned) and batches[-1]["skipped"].item() > 0


def strip_png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (9, 99, 199)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_images_beyond_the_size_limits_are_skipped_from_their_header(tmp_path, monkeypatch):
    strip = {**sample(0, prefix="strip"), "png": strip_png(1, 20000)}  # a few kB
    wide = {**sample(1, prefix="wide"), "png": strip_png(41, 10)}
    write_shard(tmp_path / "long.tar", [strip, wide, sample(2), sample(3)])
    spec = f"{tmp_path}/long.tar"
    loaded = []  # the size of every image decoded
    load = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda image: loaded.append(image.size) or load(image))
    decoder = make(tmp_path, train_shards=spec, image_size=128).decoder
    raw = next(iter(wds.DataPipeline(wds.SimpleShardList([spec]), wds.tarfile_to_samples())))
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    with pytest.warns(UserWarning, match=f"'strip0000' of {spec}: ValueError: image of 1x20000 px is beyond"):
        assert decoder(raw) is None  # it was upscaled to 128 x 2,560,000 px: 10 s and 2.2 GB
    assert time.perf_counter() - start < 0.2
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before < 100_000  # kB
    assert loaded == [] and decoder.skipped == 1
    dm = make(tmp_path, train_shards=spec, val_shards=spec)
    with pytest.warns(UserWarning, match="'wide0001'.*image of 41x10 px is beyond max_aspect_ratio=4"):
        (batch,) = list(dm.val_dataloader())
    assert batch["key"] == ["s0002", "s0003"] and batch["skipped"].item() == 2
    assert (1, 20000) not in loaded and (41, 10) not in loaded
    # the limits are data.max_pixels and data.max_aspect_ratio; the other images are 64x32
    for overrides, kept in [({"max_aspect_ratio": 41 / 10}, 3), ({"max_pixels": 64 * 32 - 1}, 0)]:
        dm = make(tmp_path, train_shards=spec, val_shards=spec, **overrides)
        assert len(quiet_val_keys(dm)) == kept, overrides
