import io
import json
import os
import tarfile

import numpy as np
import pytest
import webdataset as wds
from mulo_sd.data.cli import main
from mulo_sd.data.shards import write_shards
from PIL import Image

from mulo_sd.testbed.synthscenes import render_scene


def shard_bytes(directory):
    return {name: open(os.path.join(directory, name), "rb").read() for name in sorted(os.listdir(directory))}


def make_synthscenes(out, capsys, *extra):
    args = ["--out", str(out), "--count", "7", "--seed", "5", "--size", "32", "--shard-size", "3", *extra]
    code = main(["synthscenes", *args])
    assert code == 0
    return capsys.readouterr().out


def test_synthscenes_shards_round_trip_with_sizes_and_spec(tmp_path, capsys):
    out = make_synthscenes(tmp_path, capsys)
    spec = f"{tmp_path}/synthscenes-{{000000..000002}}.tar"
    assert spec in out.splitlines()
    sizes = json.loads((tmp_path / "sizes.json").read_text())
    assert sizes == {"synthscenes-000000.tar": 3, "synthscenes-000001.tar": 3, "synthscenes-000002.tar": 1}
    samples = list(wds.WebDataset(spec, shardshuffle=False).decode("pil"))
    assert [s["__key__"] for s in samples] == [f"{i:09d}" for i in range(7)]
    for index, sample in enumerate(samples):
        image, caption, attributes = render_scene(5, index, 32)
        assert sample["txt"] == caption and sample["json"] == attributes
        assert list(sample["png"].getdata()) == list(image.getdata())


def test_synthscenes_is_deterministic_across_runs_and_worker_counts(tmp_path, capsys):
    make_synthscenes(tmp_path / "one", capsys)
    make_synthscenes(tmp_path / "again", capsys)
    make_synthscenes(tmp_path / "two", capsys, "--workers", "2")
    assert shard_bytes(tmp_path / "one") == shard_bytes(tmp_path / "again") == shard_bytes(tmp_path / "two")
    main(["synthscenes", "--out", str(tmp_path / "seed6"), "--count", "7", "--seed", "6", "--size", "32"])
    assert (
        shard_bytes(tmp_path / "seed6")["synthscenes-000000.tar"]
        != shard_bytes(tmp_path / "one")["synthscenes-000000.tar"]
    )


def test_start_index_continues_shard_numbers_and_sizes(tmp_path, capsys):
    make_synthscenes(tmp_path, capsys)
    make_synthscenes(tmp_path, capsys, "--start-index", "9")
    sizes = json.loads((tmp_path / "sizes.json").read_text())
    assert sizes["synthscenes-000003.tar"] == 3 and sizes["synthscenes-000005.tar"] == 1 and len(sizes) == 6
    keys = [
        s["__key__"] for s in wds.WebDataset(str(tmp_path / "synthscenes-000003.tar"), shardshuffle=False)
    ]
    assert keys == ["000000009", "000000010", "000000011"]
    with pytest.raises(SystemExit, match="--start-index must be a non-negative multiple of --shard-size"):
        make_synthscenes(tmp_path, capsys, "--start-index", "4")
    with pytest.raises(SystemExit, match="already holds synthscenes-000003.tar: use another --start-index"):
        make_synthscenes(tmp_path, capsys, "--start-index", "9")


def test_from_folder_stores_images_as_is_with_captions(tmp_path, capsys):
    images = tmp_path / "images"
    (images / "sub").mkdir(parents=True)
    originals = {}
    for name, fmt in [("b.png", "PNG"), ("sub/a.v2.jpeg", "JPEG"), ("c.webp", "WEBP")]:
        buffer = io.BytesIO()
        Image.new("RGB", (12, 9), (200, 10, 30)).save(buffer, format=fmt)
        (images / name).write_bytes(buffer.getvalue())
        originals[name] = buffer.getvalue()
    (images / "b.txt").write_text("a red rectangle\n")
    (images / "notes.md").write_text("not an image")
    assert (
        main(["from-folder", "--images", str(images), "--out", str(tmp_path / "out"), "--shard-size", "2"])
        == 0
    )
    assert f"{tmp_path / 'out'}/images-{{000000..000001}}.tar" in capsys.readouterr().out
    samples = list(wds.WebDataset(f"{tmp_path}/out/images-{{000000..000001}}.tar", shardshuffle=False))
    assert [(s["__key__"], sorted(k for k in s if not k.startswith("__"))) for s in samples] == [
        ("b", ["png", "txt"]),
        ("c", ["webp"]),
        ("sub/a_v2", ["jpg"]),
    ]
    assert samples[0]["png"] == originals["b.png"] and samples[0]["txt"] == b"a red rectangle"
    assert samples[1]["webp"] == originals["c.webp"] and samples[2]["jpg"] == originals["sub/a.v2.jpeg"]
    assert json.loads((tmp_path / "out" / "sizes.json").read_text()) == {
        "images-000000.tar": 2,
        "images-000001.tar": 1,
    }


def test_from_folder_refuses_a_folder_without_images(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no jpg/jpeg/png/webp images under"):
        main(["from-folder", "--images", str(tmp_path / "empty"), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_verify_passes_good_shards_and_writes_sizes(tmp_path, capsys):
    make_synthscenes(tmp_path, capsys)
    os.remove(tmp_path / "sizes.json")
    assert main(["verify", str(tmp_path), "--write-sizes"]) == 0
    assert "total: 7  ok: 7  corrupt: 0" in capsys.readouterr().out
    assert json.loads((tmp_path / "sizes.json").read_text())["synthscenes-000000.tar"] == 3


def test_verify_reports_corrupt_sample_by_key(tmp_path, capsys):
    good = {"__key__": "good", "png": open_png(), "txt": b"a red circle", "json": b'{"ok": 1}'}
    garbage = {"__key__": "broken", "png": b"not a png at all", "txt": b"a blue star", "json": b"{}"}
    bad_json = {"__key__": "badjson", "png": open_png(), "txt": b"x", "json": b"{oops"}
    write_shards([good, garbage, bad_json], str(tmp_path), "test", shard_size=10)
    assert main(["verify", f"{tmp_path}/test-{{000000..000000}}.tar"]) == 1
    out = capsys.readouterr().out
    assert "broken: .png: UnidentifiedImageError" in out and "badjson: .json: JSONDecodeError" in out
    assert not any(" good:" in line for line in out.splitlines())
    assert "total: 3  ok: 1  corrupt: 2" in out


def test_verify_reports_truncated_and_missing_shards(tmp_path, capsys):
    make_synthscenes(tmp_path, capsys)
    path = tmp_path / "synthscenes-000001.tar"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert main(["verify", f"{tmp_path}/synthscenes-{{000000..000003}}.tar"]) == 1
    out = capsys.readouterr().out
    assert f"unreadable shard {path}" in out and "truncated" in out
    assert f"unreadable shard {tmp_path}/synthscenes-000003.tar (0 samples read): no such file" in out
    assert "unreadable shards: 2" in out


def open_png():
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4), (1, 2, 3)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_verify_fails_samples_without_an_image_and_shards_without_samples(tmp_path, capsys):
    good = {"__key__": "good", "png": open_png(), "txt": b"a red circle"}
    tokens = {"__key__": "tokens", "tok4.npy": npy_bytes(), "txt": b"pre-tokenised"}
    write_shards([good, {"__key__": "captiononly", "txt": b"no image"}, tokens], str(tmp_path), "t", 10)
    with tarfile.open(tmp_path / "t-000001.tar", "w"):
        pass  # a valid tar with no samples
    assert main(["verify", f"{tmp_path}/t-{{000000..000001}}.tar"]) == 1
    out = capsys.readouterr().out
    shard = tmp_path / "t-000000.tar"
    assert f"corrupt {shard} captiononly: no image (jpeg/jpg/png/webp) or .npy member, only .txt" in out
    assert f"empty shard {tmp_path / 't-000001.tar'}: a valid tar without samples" in out
    assert "shards: 2  unreadable shards: 0  empty shards: 1" in out and "total: 3  ok: 2  corrupt: 1" in out


def test_synthscenes_refuses_a_non_empty_folder_unless_overwrite(tmp_path, capsys):
    make_synthscenes(tmp_path / "out", capsys)  # seed 5: 7 scenes in 3 shards
    before = shard_bytes(tmp_path / "out")

    def seed6(out, *extra):
        args = ["--out", str(out), "--count", "4", "--seed", "6", "--size", "32", "--shard-size", "3"]
        return main(["synthscenes", *args, *extra])

    with pytest.raises(SystemExit, match="out is not empty .*pass --overwrite"):
        seed6(tmp_path / "out")
    with pytest.raises(SystemExit, match="synthscenes-000000.tar does not hold scenes of --seed 6"):
        seed6(tmp_path / "out", "--start-index", "9")
    assert shard_bytes(tmp_path / "out") == before
    (tmp_path / "out" / "synthscenes-000009.tar.partial").write_bytes(b"left by a killed run")
    assert seed6(tmp_path / "out", "--overwrite") == seed6(tmp_path / "fresh") == 0
    assert shard_bytes(tmp_path / "out") == shard_bytes(tmp_path / "fresh")  # old shards and .partial gone
    assert json.loads((tmp_path / "out" / "sizes.json").read_text()) == {
        "synthscenes-000000.tar": 3,
        "synthscenes-000001.tar": 1,
    }


def test_from_folder_names_a_non_utf8_caption_and_leaves_no_partial_shard(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    for name in "abcde":
        (images / f"{name}.png").write_bytes(open_png())
    (images / "d.txt").write_bytes("café".encode("latin-1"))
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match=f"caption {images / 'd.txt'} is not UTF-8"):
        main(["from-folder", "--images", str(images), "--out", str(out), "--shard-size", "2"])
    # the failure came while writing the second shard: the first is complete and listed, no other file
    assert sorted(os.listdir(out)) == ["images-000000.tar", "sizes.json"]
    assert json.loads((out / "sizes.json").read_text()) == {"images-000000.tar": 2}
    assert [s["__key__"] for s in wds.WebDataset(str(out / "images-000000.tar"), shardshuffle=False)] == [
        "a",
        "b",
    ]


def npy_bytes():
    buffer = io.BytesIO()
    np.save(buffer, np.zeros((4, 4), dtype=np.int16))
    return buffer.getvalue()


def captioned_and_uncaptioned_shard(directory):
    samples = [
        {"__key__": "captioned", "png": open_png(), "txt": b"a red circle"},
        {"__key__": "nocaption", "png": open_png()},
        {"__key__": "blank", "png": open_png(), "txt": b" \n"},
        {"__key__": "tokensonly", "tok4.npy": npy_bytes()},
    ]
    write_shards(samples, str(directory), "c", 10)
    return directory / "c-000000.tar"


def test_verify_fails_samples_without_a_caption_unless_allowed(tmp_path, capsys):
    shard = captioned_and_uncaptioned_shard(tmp_path)
    assert main(["verify", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"no caption {shard} nocaption: no .txt member" in out
    assert f"no caption {shard} blank: blank .txt member" in out
    assert f"no caption {shard} tokensonly: no .txt member" in out
    assert "total: 4  ok: 1  corrupt: 0  too large: 0  no caption: 3" in out
    assert main(["verify", str(tmp_path), "--allow-missing-captions"]) == 0
    out = capsys.readouterr().out
    assert "no caption: 3  (allowed)" in out and "ok: 4" in out and "nocaption:" not in out


def png_of(width, height):
    buffer = io.BytesIO()
    Image.new("L", (width, height), 7).save(buffer, format="PNG")
    return buffer.getvalue()


def test_verify_lists_images_beyond_the_size_limits_without_decoding_them(tmp_path, capsys):
    strip = png_of(1, 20000)  # a few hundred bytes; the loader used to upscale it to 20,000 x 20,000 px
    samples = [
        {"__key__": "strip", "png": strip, "txt": b"a line"},
        {"__key__": "wide", "png": png_of(41, 10), "txt": b"a wide one"},
        {"__key__": "square", "png": png_of(40, 40), "txt": b"a square"},
    ]
    write_shards(samples, str(tmp_path), "big", 10)
    shard = tmp_path / "big-000000.tar"
    assert main(["verify", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"too large {shard} strip: image of 1x20000 px is beyond max_aspect_ratio=4" in out
    assert f"too large {shard} wide: image of 41x10 px is beyond max_aspect_ratio=4" in out
    assert "total: 3  ok: 1  corrupt: 0  too large: 2" in out
    assert main(["verify", str(tmp_path), "--max-aspect-ratio", "20000", "--max-pixels", "20000"]) == 0
    capsys.readouterr()
    assert main(["verify", str(tmp_path), "--max-aspect-ratio", "20000", "--max-pixels", "1599"]) == 1
    assert f"too large {shard} square: image of 40x40 px is over max_pixels=1599" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="max_aspect_ratio >= 1"):
        main(["verify", str(tmp_path), "--max-aspect-ratio", "0.5"])


def test_from_folder_skips_and_names_files_that_are_not_images(tmp_path, capsys):
    images = tmp_path / "images"
    images.mkdir()
    (images / "a_good.png").write_bytes(open_png())
    (images / "b_empty.png").write_bytes(b"")
    (images / "c_text.jpg").write_text("this is a web page, not a jpeg")
    (images / "d_truncated.png").write_bytes(png_of(64, 64)[:60])
    (images / "e_good.webp").write_bytes(png_of(8, 8))  # the content decides, not the extension
    out = tmp_path / "out"
    assert main(["from-folder", "--images", str(images), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"skipped {images / 'b_empty.png'}: not a usable image (empty file (0 bytes))" in printed
    assert f"skipped {images / 'c_text.jpg'}: not a usable image (UnidentifiedImageError" in printed
    assert f"skipped {images / 'd_truncated.png'}: not a usable image (" in printed
    assert "wrote 2 images to 1 shards; skipped 3 files" in printed
    keys = [s["__key__"] for s in wds.WebDataset(str(out / "images-000000.tar"), shardshuffle=False)]
    assert keys == ["a_good", "e_good"]
    for name in ["a_good.png", "e_good.webp"]:
        os.remove(images / name)
    with pytest.raises(SystemExit, match="none of the 3 image files under .* decodes"):
        main(["from-folder", "--images", str(images), "--out", str(tmp_path / "none")])
    assert not (tmp_path / "none").exists()


def test_from_folder_refuses_a_folder_of_other_shards_unless_overwrite(tmp_path, capsys):
    make_synthscenes(tmp_path / "scenes", capsys)
    scenes = shard_bytes(tmp_path / "scenes")
    images = tmp_path / "images"
    images.mkdir()
    for name in "abc":
        (images / f"{name}.png").write_bytes(open_png())

    def from_folder(out, *extra):
        return main(["from-folder", "--images", str(images), "--out", str(out), "--shard-size", "1", *extra])

    with pytest.raises(SystemExit, match="scenes is not empty .*pass --overwrite to delete its images-"):
        from_folder(tmp_path / "scenes")
    assert shard_bytes(tmp_path / "scenes") == scenes  # sizes.json not merged either
    assert from_folder(tmp_path / "photos") == 0
    os.remove(images / "c.png")
    with pytest.raises(SystemExit, match="photos is not empty"):
        from_folder(tmp_path / "photos")
    assert from_folder(tmp_path / "photos", "--overwrite") == 0
    assert sorted(os.listdir(tmp_path / "photos")) == ["images-000000.tar", "images-000001.tar", "sizes.json"]
    assert json.loads((tmp_path / "photos" / "sizes.json").read_text()) == {
        "images-000000.tar": 1,
        "images-000001.tar": 1,
    }
