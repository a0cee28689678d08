import concurrent.futures
import io
import json
import os
import time

import numpy as np
import pytest
import webdataset as wds
from mulo_sd.data import pretokenize as pretokenize_module
from mulo_sd.data.cli import main, synthscenes_sample
from mulo_sd.data.pretokenize import MANIFEST_NAME, ensure_pretokenized, output_spec, pretokenize
from mulo_sd.data.shards import write_shards
from mulo_sd.training.sample_decoding import center_crop, to_tensor
from PIL import Image

from mulo_sd.nets.vq import VQModel
from tests.helpers import tiny_vq

SIZES = [32, 16, 8]  # the tiny ds8 VQ gives tok4, tok2, tok1


@pytest.fixture
def vq_folder(tmp_path):
    return str(tiny_vq(0).save_pretrained(tmp_path / "vq"))


def png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def image_shards(tmp_path):
    """Two shards: SynthScenes at 40 px (cropped, downscaled), a non-square image and a corrupt one."""
    samples = [synthscenes_sample(i, seed=3, size=40) for i in range(4)]
    wide = Image.fromarray(np.random.default_rng(0).integers(0, 256, (36, 50, 3), dtype=np.uint8))
    samples.append({"__key__": "wide", "png": png_bytes(wide), "txt": b"a red circle"})
    samples.insert(2, {"__key__": "broken", "png": b"not a png", "txt": b"x", "json": b"{}"})
    out = tmp_path / "images"
    write_shards(samples, str(out), "img", shard_size=3)
    return f"{out}/img-{{000000..000001}}.tar", samples


def read_tokens(spec):
    return list(wds.WebDataset(spec, shardshuffle=False, empty_check=False))


@pytest.mark.filterwarnings("ignore:skipped sample")
def test_tokens_equal_vq_encode_of_the_cropped_images(tmp_path, vq_folder, image_shards, capsys):
    spec, samples = image_shards
    out = tmp_path / "tokens"
    args = ["--shards", spec, "--tokenizer", vq_folder, "--out", str(out), "--batch-size", "2"]
    assert main(["pretokenize", *args, "--sizes", *map(str, SIZES)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1] == f"{out}/img-{{000000..000001}}.tar"
    assert sorted(os.listdir(out)) == ["img-000000.tar", "img-000001.tar", "sizes.json"]
    assert json.loads((out / "sizes.json").read_text()) == {"img-000000.tar": 2, "img-000001.tar": 3}

    vq = VQModel.from_pretrained(vq_folder)
    good = [sample for sample in samples if sample["__key__"] != "broken"]
    tokens = read_tokens(printed[-1])
    assert [t["__key__"] for t in tokens] == [s["__key__"] for s in good]
    for sample, token_sample in zip(good, tokens, strict=True):
        assert token_sample["txt"] == sample["txt"]
        assert token_sample.get("json") == sample.get("json")
        assert not any(name.endswith("png") for name in token_sample)
        crop = center_crop(Image.open(io.BytesIO(sample["png"])).convert("RGB"), SIZES[0])
        for size in SIZES:
            image = crop if size == SIZES[0] else crop.resize((size, size), Image.Resampling.BOX)
            grid = np.load(io.BytesIO(token_sample[f"tok{size // 8}.npy"]))
            assert grid.dtype == np.int16 and grid.shape == (size // 8, size // 8)
            np.testing.assert_array_equal(grid, vq.encode(to_tensor(image)[None])[0].numpy())


def test_corrupt_samples_are_skipped_and_counted(tmp_path, vq_folder, image_shards, capsys):
    spec, _ = image_shards
    args = ["--shards", spec, "--tokenizer", vq_folder, "--out", str(tmp_path / "tokens"), "--sizes", "32"]
    with pytest.warns(UserWarning, match="skipped sample 'broken'"):
        main(["pretokenize", *args])
    printed = capsys.readouterr().out.splitlines()
    assert printed[-2] == "tokenized 5 images at 32 px; skipped 1 corrupt samples"
    assert "broken" not in [t["__key__"] for t in read_tokens(printed[-1])]


@pytest.mark.filterwarnings("ignore:skipped sample")
def test_ensure_pretokenized_reuses_and_refuses_other_tokens(tmp_path, vq_folder, image_shards, monkeypatch):
    spec, _ = image_shards
    out = str(tmp_path / "tokens")
    made = ensure_pretokenized(spec, vq_folder, SIZES, out)
    assert made == output_spec(spec, out) and os.path.isfile(os.path.join(out, MANIFEST_NAME))

    def must_not_run(*args, **kwargs):
        raise AssertionError("tokens were made again")

    monkeypatch.setattr("mulo_sd.data.pretokenize.pretokenize", must_not_run)
    assert ensure_pretokenized(spec, vq_folder, SIZES, out) == made
    with pytest.raises(ValueError, match="holds tokens made with"):
        ensure_pretokenized(spec, vq_folder, [32, 16], out)
    retrained = str(tiny_vq(1).save_pretrained(tmp_path / "vq_retrained"))
    with pytest.raises(ValueError, match="holds tokens made with"):
        ensure_pretokenized(spec, retrained, SIZES, out)


def test_bad_arguments_are_refused(tmp_path, vq_folder, image_shards):
    spec, _ = image_shards
    args = ["pretokenize", "--shards", spec, "--tokenizer", vq_folder, "--out", str(tmp_path / "t")]
    with pytest.raises(
        SystemExit, match="multiples of the tokenizer's downsample factor 8, got \\[32, 12\\]"
    ):
        main([*args, "--sizes", "32", "12"])
    with pytest.raises(SystemExit, match="config.json not found"):
        main([*args[:3], "--tokenizer", str(tmp_path), "--out", str(tmp_path / "t"), "--sizes", "32"])
    with pytest.raises(ValueError, match="braces in its directory"):
        output_spec("shards/{a,b}/img-000000.tar", "out")


@pytest.mark.filterwarnings("ignore:skipped sample")
def test_concurrent_ensure_pretokenized_encodes_once(tmp_path, vq_folder, image_shards, monkeypatch):
    spec, _ = image_shards
    single, _, _ = pretokenize(spec, vq_folder, SIZES, str(tmp_path / "single"))
    encode = pretokenize_module.pretokenize
    calls = []

    def slow_encode(*args, **kwargs):  # slow enough that the second thread asks while the first encodes
        calls.append(args)
        time.sleep(0.5)
        return encode(*args, **kwargs)

    monkeypatch.setattr(pretokenize_module, "pretokenize", slow_encode)
    out = str(tmp_path / "cache" / "tokens")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(ensure_pretokenized, spec, vq_folder, SIZES, out) for _ in range(2)]
        assert [run.result() for run in runs] == [output_spec(spec, out)] * 2
    assert len(calls) == 1
    tars = ["img-000000.tar", "img-000001.tar"]
    assert [(tmp_path / "cache" / "tokens" / name).read_bytes() for name in tars] == [
        (tmp_path / "single" / name).read_bytes() for name in tars
    ]
    assert sorted(os.listdir(tmp_path / "cache")) == [".tokens.lock", "tokens"]


@pytest.mark.filterwarnings("ignore:skipped sample")
def test_pipe_shards_need_allow_pipe(tmp_path, vq_folder, image_shards, capsys):
    spec, _ = image_shards
    first = spec.replace("{000000..000001}", "000000")
    args = ["pretokenize", "--shards", f"pipe:cat {first}", "--tokenizer", vq_folder, "--sizes", "32"]
    args += ["--out", str(tmp_path / "tokens")]
    with pytest.raises(SystemExit, match="has 1 pipe: URLs.*--allow-pipe"):
        main(args)
    assert main([*args, "--allow-pipe"]) == 0
    assert "tokenized 2 images at 32 px; skipped 1 corrupt samples" in capsys.readouterr().out
