"""Official checkpoint files: safe unpickling, the settings they store, and the config read from them."""

import os
from pathlib import Path, PurePosixPath

import pytest
import torch

from mulo_sd.llamagen import gpt_from_official
from mulo_sd.llamagen.official import OfficialCheckpoint, OfficialCheckpointError, read_official
from mulo_sd.llamagen.official_configs import gpt_fields
from mulo_sd.nets import GPTConfig
from tests.official_fixtures import (
    GPT_HEADS,
    llamagen_gpt_shapes,
    llamagen_t2i_args,
    write_llamagen_gpt,
    write_tar_ar_dtok,
)


class MakesDirectory:
    """Unpickling this calls os.mkdir: what an untrusted file could do if it were fully unpickled."""

    def __init__(self, target: str):
        self.target = target

    def __reduce__(self):
        return os.mkdir, (self.target,)


def test_training_args_are_read_and_nothing_else_is_unpickled(tmp_path):
    path = tmp_path / "t2i.pt"
    write_llamagen_gpt(path, 64, 120)
    checkpoint = read_official(path)
    assert checkpoint.family == "llamagen-gpt" and sorted(checkpoint.weight_sets) == ["model"]
    assert checkpoint.settings == vars(llamagen_t2i_args(64, 120))

    marker = tmp_path / "created_by_unpickling"
    torch.save({"model": checkpoint.weights(), "hook": MakesDirectory(str(marker))}, tmp_path / "hostile.pt")
    with pytest.raises(
        OfficialCheckpointError, match=r"needs \['(posix|os)\.mkdir'\] to unpickle.*--trust-pickle"
    ):
        read_official(tmp_path / "hostile.pt")
    assert not marker.exists()

    write_llamagen_gpt(tmp_path / "paths.pt", 64, 120, args_overrides={"data_path": PurePosixPath("/data")})
    with pytest.raises(OfficialCheckpointError, match=r"needs \['pathlib.*PurePosixPath'\]"):
        read_official(tmp_path / "paths.pt")
    trusted = read_official(tmp_path / "paths.pt", trust_pickle=True)
    assert trusted.settings["data_path"] == PurePosixPath("/data")

    (tmp_path / "text.pt").write_text("not a checkpoint")
    with pytest.raises(OfficialCheckpointError, match="text.pt is not a readable torch checkpoint"):
        read_official(tmp_path / "text.pt")


def test_stored_settings_win_and_flags_fill_the_gaps(tmp_path):
    path = tmp_path / "t2i.pt"
    write_llamagen_gpt(path, 64, 120)
    with pytest.raises(ValueError, match=r"--cls-token-num 64 disagrees with .* args.cls_token_num = 120"):
        gpt_from_official(path, n_head=GPT_HEADS, cls_token_num=64)
    loaded = gpt_from_official(path, n_head=GPT_HEADS)
    with pytest.raises(ValueError, match=r"cond_len is 5, checkpoint args.cls_token_num gives 120"):
        gpt_from_official(path, GPTConfig(**{**vars(loaded.config), "cond_len": 5}))
    with pytest.raises(ValueError, match=r"model size 'GPT-tiny' .* is not one of .*: pass --n-head"):
        gpt_from_official(path)

    release = tmp_path / "release.pt"  # {"model": ...} only, as published
    write_llamagen_gpt(release, args=False)
    with pytest.raises(ValueError, match="stores no training args: pass .* --image-size"):
        gpt_from_official(release, n_head=GPT_HEADS)
    from_flags = gpt_from_official(release, n_head=GPT_HEADS, image_size=64)
    assert (from_flags.config.grid_size, from_flags.config.cond_len) == ((4, 4), 120)  # LlamaGen's default


def test_published_sizes_are_read_off_the_shapes():
    """t2i_XL_stage1_256.pt without args: GPT-XL from 36 layers of width 1280, the rest from the shapes."""
    shapes = llamagen_gpt_shapes(dim=1280, n_layer=36, n_head=20, vocab_size=16384, caption_dim=2048)
    state = {name: torch.empty(shape, device="meta") for name, shape in shapes.items()}
    release = OfficialCheckpoint(Path("t2i_XL_stage1_256.pt"), "llamagen-gpt", {}, None, {"model": state})
    fields = gpt_fields(release, state, image_size=256)
    assert GPTConfig(**fields.values) == GPTConfig.llamagen_t2i_xl(256)
    assert fields.origins["n_head"] == "size GPT-XL (its depth and width match the weights)"
    assert fields.origins["cond_len"] == "LlamaGen's default --cls-token-num 120"
    trained = OfficialCheckpoint(
        Path("0050000.pt"), "llamagen-gpt", vars(llamagen_t2i_args(512, 120)), None, {}
    )
    trained.settings["gpt_model"] = "GPT-XL"
    assert GPTConfig(**gpt_fields(trained, state).values) == GPTConfig.llamagen_t2i_xl(512)
    with pytest.raises(
        ValueError, match=r"--model-size GPT-L disagrees with checkpoint args.gpt_model 'GPT-XL'"
    ):
        gpt_fields(trained, state, model_size="L")

    shapes = llamagen_gpt_shapes(dim=1280, n_layer=30, n_head=20, vocab_size=16384, caption_dim=None)
    del shapes["cls_embedding.embedding_table.weight"]
    shapes.update(
        {"clip_proj.weight": (1280, 1152), "clip_proj.bias": (1280,), "abs_pe": (1, 256 + 728, 1280)}
    )
    state = {name: torch.empty(shape, device="meta") for name, shape in shapes.items()}
    settings = {"cls_token_num": 729, "max_seq_len": 256}
    tar = OfficialCheckpoint(Path("ar_dtok_lp_256px.pth"), "tar-ar-dtok", settings, "llama-abs-LP", {})
    assert GPTConfig(**gpt_fields(tar, state).values) == GPTConfig.tar_ar_dtok(256)
    assert GPTConfig(**gpt_fields(tar, state, cond_len=169).values) == GPTConfig.tar_ar_dtok(
        256, cond_len=169
    )


def test_tar_settings_are_read_from_its_spec(tmp_path):
    path = tmp_path / "ar_dtok.pth"
    write_tar_ar_dtok(path, grid=2, cls_token_num=9)
    model = gpt_from_official(path, n_head=GPT_HEADS)
    c = model.config
    assert (c.cond_type, c.grid_size, c.cond_len, c.n_positions, c.caption_dim) == (
        "tatok",
        (2, 2),
        9,
        12,
        16,
    )
    smaller_prefix = gpt_from_official(path, n_head=GPT_HEADS, cond_len=4)  # another TA-Tok scale
    assert (smaller_prefix.config.cond_len, smaller_prefix.config.n_positions) == (4, 12)
    with pytest.raises(ValueError, match=r"--max-seq-len 9 disagrees with .* args.max_seq_len = 4"):
        gpt_from_official(path, n_head=GPT_HEADS, max_seq_len=9)
