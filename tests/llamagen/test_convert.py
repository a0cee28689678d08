"""`mulo-convert`: official-layout files -> model folders whose models equal the `gpt_from_official` /
`vq_from_official` ones."""

import json
import shutil
import subprocess

import pytest
import torch

from mulo_sd.llamagen import gpt_from_official, vq_from_official
from mulo_sd.llamagen.convert import main
from mulo_sd.llamagen.t5 import left_pad
from mulo_sd.nets import GPT, VQModel
from tests.official_fixtures import (
    CAPTION_DIM,
    CODEBOOK,
    GPT_HEADS,
    write_llamagen_gpt,
    write_llamagen_vq,
    write_tar_ar_dtok,
)


def teacher_forced(model: GPT, seed: int = 0) -> torch.Tensor:
    """Logits of two captions (one padded) and their unconditional rows, over random grid tokens."""
    g = torch.Generator().manual_seed(seed)
    c = model.config
    if c.cond_type == "t5":
        rows = [torch.randn(n, CAPTION_DIM, generator=g) for n in (c.cond_len, max(1, c.cond_len // 3))]
        cond, mask = left_pad(rows, c.cond_len)
    else:
        cond, mask = torch.randn(2, c.cond_len, c.caption_dim, generator=g), None
    tokens = torch.randint(0, c.vocab_size, (2, c.num_tokens), generator=g)
    with torch.no_grad():
        conditional = model(tokens, cond, mask, drop=torch.tensor([False, False]))
        unconditional = model(tokens, cond, mask, drop=torch.tensor([True, True]))
    return torch.cat([conditional, unconditional])


@pytest.mark.parametrize("image_size, cls_token_num", [(32, 120), (64, 7)])
def test_llamagen_gpt_round_trip(tmp_path, capsys, image_size, cls_token_num):
    source, out = tmp_path / "t2i.pt", tmp_path / "t2i"
    write_llamagen_gpt(source, image_size, cls_token_num)
    assert main(["llamagen-gpt", str(source), str(out), "--n-head", str(GPT_HEADS)]) == 0
    printed = capsys.readouterr().out
    assert f"cond_len = {cls_token_num}  (checkpoint args.cls_token_num)" in printed
    assert f"grid_size = {(image_size // 16,) * 2}  (checkpoint args.image_size / checkpoint args." in printed
    converted, official = GPT.from_pretrained(out), gpt_from_official(source, n_head=GPT_HEADS)
    assert converted.config == official.config and converted.config.cond_len == cls_token_num
    assert json.loads((out / "config.json").read_text())["grid_size"] == [image_size // 16] * 2
    assert torch.equal(teacher_forced(converted), teacher_forced(official))


def test_release_file_ema_weights_and_flags(tmp_path, capsys):
    source = tmp_path / "t2i_release.pt"
    write_llamagen_gpt(source, args=False, ema=True)
    with pytest.raises(SystemExit, match="llamagen-gpt: .* stores no training args: pass .*--image-size"):
        main(["llamagen-gpt", str(source), str(tmp_path / "a"), "--n-head", "4"])
    argv = ["llamagen-gpt", str(source), str(tmp_path / "ema"), "--n-head", "4", "--image-size", "64"]
    assert main([*argv, "--weights", "ema"]) == 0
    assert "cond_len = 120  (LlamaGen's default --cls-token-num 120)" in capsys.readouterr().out
    converted = GPT.from_pretrained(tmp_path / "ema")
    assert converted.config.grid_size == (4, 4)
    ema = torch.load(source, weights_only=True)["ema"]
    assert torch.equal(converted.state_dict()["output.weight"], ema["output.weight"])
    with pytest.raises(SystemExit, match="already holds a model; pass --force"):
        main(argv)
    assert main([*argv, "--force"]) == 0  # the "model" weights this time
    model = torch.load(source, weights_only=True)["model"]
    assert torch.equal(GPT.from_pretrained(tmp_path / "ema").output.weight, model["output.weight"])


def test_llamagen_vq_round_trip(tmp_path):
    source, out = tmp_path / "vq_ds16_t2i.pt", tmp_path / "vq"
    write_llamagen_vq(source, ema=True)
    assert main(["llamagen-vq", str(source), str(out)]) == 0
    converted, official = VQModel.from_pretrained(out), vq_from_official(source)
    assert converted.config == official.config and converted.downsample_factor == 16
    ids = torch.randint(0, CODEBOOK, (1, 2, 2), generator=torch.Generator().manual_seed(0))
    assert torch.equal(converted.decode(ids), official.decode(ids))
    images = converted.decode(ids)
    assert torch.equal(converted.encode(images), official.encode(images))


def test_tar_ar_dtok_round_trip(tmp_path, capsys):
    source, out = tmp_path / "ar_dtok.pth", tmp_path / "tar"
    write_tar_ar_dtok(source, grid=2, cls_token_num=9)
    assert main(["tar-ar-dtok", str(source), str(out), "--n-head", "4", "--cond-len", "4"]) == 0
    assert "n_positions = 12  (weights: abs_pe)" in capsys.readouterr().out
    converted = GPT.from_pretrained(out)
    official = gpt_from_official(source, n_head=GPT_HEADS, cond_len=4)
    assert converted.config.cond_len == 4 and converted.config == official.config
    assert torch.equal(teacher_forced(converted), teacher_forced(official))


def test_files_of_another_family_are_refused(tmp_path):
    write_llamagen_vq(tmp_path / "vq.pt")
    write_llamagen_gpt(tmp_path / "gpt.pt")
    write_tar_ar_dtok(tmp_path / "tar.pth")
    cases = [
        ("llamagen-gpt", "vq.pt", "LlamaGen VQ tokenizer", "llamagen-vq"),
        ("llamagen-vq", "gpt.pt", r"LlamaGen GPT \(t2i or c2i\)", "llamagen-gpt"),
        ("llamagen-gpt", "tar.pth", "Tar AR-DTok GPT", "tar-ar-dtok"),
    ]
    for command, name, holds, right in cases:
        with pytest.raises(
            SystemExit, match=rf"{command}: .*{name} holds a {holds} .* `mulo-convert {right}`"
        ):
            main([command, str(tmp_path / name), str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # a fresh interpreter importing torch: several seconds
def test_console_script(tmp_path):
    assert shutil.which("mulo-convert"), "the mulo-convert console script is not installed: pip install -e ."
    write_llamagen_gpt(tmp_path / "t2i.pt", 32, 7)
    argv = ["llamagen-gpt", str(tmp_path / "t2i.pt"), str(tmp_path / "out"), "--n-head", "4"]
    run = subprocess.run(["mulo-convert", *argv, "--cls-token-num", "9"], capture_output=True, text=True)
    assert (
        run.returncode == 1
        and "--cls-token-num 9 disagrees with the file's own training setting" in run.stderr
    )
