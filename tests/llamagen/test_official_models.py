"""Models from official-layout files (mulo_sd/llamagen/official_models.py): LlamaGen t2i / c2i and Tar
AR-DTok GPTs and the LlamaGen VQ load with their weights intact, and files of another shape are refused."""

import pytest
import torch

from mulo_sd.llamagen import gpt_from_official, vq_from_official
from mulo_sd.nets import VQConfig, VQModel
from tests.nets.test_gpt import GRID, VOCAB, make_cond, make_config, make_model, random_tokens
from tests.nets.test_vq import OFFICIAL_VQ16_SHAPES, TINY, images, tiny
from tests.official_fixtures import (
    CAPTION_DIM,
    CODEBOOK,
    GPT_DIM,
    GPT_HEADS,
    GPT_LAYERS,
    write_llamagen_gpt,
    write_llamagen_vq,
)

# ---- GPT --------------------------------------------------------------------------------------------

LLAMAGEN_T2I_KEYS = [
    "tok_embeddings.weight",
    "cls_embedding.cap_proj.fc1.weight",
    "cls_embedding.cap_proj.fc2.weight",
    "cls_embedding.uncond_embedding",
    "layers.0.attention.wqkv.weight",
    "layers.0.attention.wo.weight",
    "layers.0.feed_forward.w1.weight",
    "layers.0.feed_forward.w2.weight",
    "layers.0.feed_forward.w3.weight",
    "layers.0.attention_norm.weight",
    "layers.0.ffn_norm.weight",
    "norm.weight",
    "output.weight",
]
LLAMAGEN_C2I_KEYS = [
    "cls_embedding.embedding_table.weight",
    "layers.1.attention.wqkv.weight",
    "output.weight",
]
TAR_KEYS = [
    "abs_pe",
    "clip_proj.weight",
    "clip_proj.bias",
    "layers.1.feed_forward.w3.weight",
    "output.weight",
]


def official_state(config, names):
    """A random state dict written under the official names (asserted to be exactly the model's)."""
    state = {k: v.detach().clone().float() for k, v in make_model(config, seed=5).state_dict().items()}
    assert set(names) <= set(state)
    return state


@pytest.mark.parametrize("image_size, cls_token_num", [(32, 120), (64, 7)])
def test_llamagen_t2i_checkpoint_loads(tmp_path, image_size, cls_token_num):
    """A train_t2i.py checkpoint loads with its stored args. Its uncond_embedding has 120 rows whatever
    --cls-token-num was; LlamaGen's prefix is cls_embedding(caption)[:, :cls_token_num], so the first rows
    act and are the ones kept."""
    path = tmp_path / "t2i.pt"
    state = write_llamagen_gpt(path, image_size, cls_token_num)
    uncond = state["cls_embedding.uncond_embedding"]
    assert uncond.shape == (120, CAPTION_DIM)
    loaded = gpt_from_official(path, n_head=GPT_HEADS)  # the tiny size is not in LlamaGen's table
    grid = image_size // 16
    expected = dict(
        grid_size=(grid, grid), cond_len=cls_token_num, cond_type="t5", caption_dim=CAPTION_DIM,
        position="rope2d", dim=GPT_DIM, n_layer=GPT_LAYERS, n_head=GPT_HEADS, n_kv_head=None,
        vocab_size=CODEBOOK,
    )  # fmt: skip
    assert {name: getattr(loaded.config, name) for name in expected} == expected
    loaded_state = loaded.state_dict()
    assert torch.equal(loaded_state["cls_embedding.uncond_embedding"], uncond[:cls_token_num])
    assert all(
        torch.equal(loaded_state[k], v) for k, v in state.items() if k != "cls_embedding.uncond_embedding"
    )
    with torch.no_grad():  # the unconditional prefix, computed LlamaGen's way from all 120 rows
        want = loaded.cls_embedding.cap_proj(uncond)[:cls_token_num]
        got = loaded._embed_condition(torch.zeros(1, cls_token_num, CAPTION_DIM), torch.tensor([True]))[0]
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_llamagen_c2i_checkpoint_loads(tmp_path):
    config = make_config("class", "rope2d")
    state = official_state(config, LLAMAGEN_C2I_KEYS)
    assert state["cls_embedding.embedding_table.weight"].shape == (11, 32)  # num_classes + null class
    torch.save({"model": state}, tmp_path / "c2i.pt")
    loaded = gpt_from_official(tmp_path / "c2i.pt", config)
    for key, value in state.items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_tar_ar_dtok_checkpoint_loads(tmp_path):
    config = make_config("tatok", "absolute", n_kv_head=None, n_positions=3 + 12 - 1)
    state = official_state(config, TAR_KEYS)
    assert state["abs_pe"].shape == (1, 14, 32)  # max_seq_len + cls_token_num - 1 rows, as Tar builds it
    spec = {"name": "llama-abs-tiny", "args": {"cls_token_num": 3, "max_seq_len": 12}, "sd": state}
    torch.save({"model": spec}, tmp_path / "ar_dtok_tiny.pth")
    loaded = gpt_from_official(tmp_path / "ar_dtok_tiny.pth", config).double()
    expected = make_model(config, seed=5)
    cond, tokens = make_cond(config, 1), random_tokens(1)
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens, cond), expected(tokens, cond), atol=1e-5, rtol=1e-5)
    state_ = loaded.start(cond, 1.0)
    assert model_step_last_position(loaded, state_, tokens).shape == (1, 1, VOCAB)


def model_step_last_position(model, state, tokens):
    """Tar's table has no row for the last grid token; writing it must still work."""
    return model.step(state, tokens[:, -1:], torch.tensor([GRID[0] * GRID[1] - 1]))


def test_official_loader_refuses_other_architectures(tmp_path):
    config = make_config("t5", n_kv_head=None)
    with pytest.raises(FileNotFoundError, match="huggingface.co/peizesun/llamagen_t2i"):
        gpt_from_official(tmp_path / "t2i_XL_stage1_256.pt", config)
    vq = {"encoder.conv_in.weight": torch.zeros(4, 3, 3, 3), "quantize.embedding.weight": torch.zeros(16, 8)}
    torch.save({"model": vq}, tmp_path / "vq.pt")
    with pytest.raises(ValueError, match=r"holds a LlamaGen VQ tokenizer .*`mulo-convert llamagen-vq`"):
        gpt_from_official(tmp_path / "vq.pt", config)
    wider = official_state(make_config("t5", n_kv_head=None, dim=48, n_head=4), LLAMAGEN_T2I_KEYS)
    torch.save({"model": wider}, tmp_path / "wider.pt")
    with pytest.raises(ValueError, match=r"tok_embeddings.weight: checkpoint \[64, 48\] vs model \[64, 32\]"):
        gpt_from_official(tmp_path / "wider.pt", config)
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(ValueError, match="list.pt holds a list, not a checkpoint dict"):
        gpt_from_official(tmp_path / "list.pt", config)


# ---- VQ ---------------------------------------------------------------------------------------------


def test_vq_official_checkpoint_loads(tmp_path):
    torch.manual_seed(0)
    source = VQModel(VQConfig.llamagen_ds16()).eval()
    state = source.state_dict()
    assert set(OFFICIAL_VQ16_SHAPES) <= set(state)
    path = tmp_path / "vq_ds16_t2i.pt"
    torch.save({"model": state}, path)
    loaded = vq_from_official(path)
    assert not loaded.training and loaded.downsample_factor == 16
    for key in OFFICIAL_VQ16_SHAPES:
        assert torch.equal(loaded.state_dict()[key], state[key])
    x = images(16, batch=1)
    ids = source.encode(x)
    assert ids.shape == (1, 1, 1)
    assert torch.equal(loaded.encode(x), ids)
    assert torch.equal(loaded.decode(ids), source.decode(ids))


@pytest.mark.parametrize("wrap", [dict, lambda sd: {"state_dict": sd}, lambda sd: {"module": sd}])
def test_vq_official_wrappers(tmp_path, wrap):
    vq = tiny()
    torch.save(wrap(vq.state_dict()), tmp_path / "vq.pt")
    loaded = vq_from_official(tmp_path / "vq.pt", **TINY)
    assert torch.equal(loaded.codebook, vq.codebook)


def test_vq_official_weights_choice(tmp_path):
    """LlamaGen's sample scripts load "model"; "ema" is a choice; asking for a set the file lacks fails."""
    path = tmp_path / "vq_train.pt"
    model_state = write_llamagen_vq(path, ema=True)
    checkpoint = torch.load(path, weights_only=False)
    default, ema = vq_from_official(path), vq_from_official(path, weights="ema")
    for key in ("quantize.embedding.weight", "decoder.conv_out.weight"):
        assert torch.equal(default.state_dict()[key], model_state[key])
        assert torch.equal(ema.state_dict()[key], checkpoint["ema"][key])
        assert not torch.equal(ema.state_dict()[key], model_state[key])
    config = default.config  # read off the shapes and the stored args
    expected = dict(ch=32, z_channels=32, encoder_ch_mult=[1, 1, 2, 2, 4], num_res_blocks=2, codebook_size=64)
    assert {name: getattr(config, name) for name in expected} == expected
    write_llamagen_vq(tmp_path / "release.pt", args=False)
    with pytest.raises(ValueError, match=r"release.pt has no 'ema' weights; it holds \['model'\]"):
        vq_from_official(tmp_path / "release.pt", weights="ema")
    with pytest.raises(ValueError, match="weights must be one of"):
        vq_from_official(path, weights="swa")


def test_vq_official_checkpoint_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="vq_ds16_t2i.pt from the LlamaGen release"):
        vq_from_official(tmp_path / "absent.pt")

    state = tiny().state_dict()
    state["decoder.conv_out.bias_renamed"] = state.pop("decoder.conv_out.bias")
    torch.save({"model": state}, tmp_path / "renamed.pt")
    with pytest.raises(
        ValueError, match=r"(?s)missing \(1\): \['decoder.conv_out.bias'\].*unexpected \(1\): .*bias_renamed"
    ):
        vq_from_official(tmp_path / "renamed.pt", **TINY)

    torch.save({"model": tiny().state_dict()}, tmp_path / "tiny.pt")
    with pytest.raises(
        ValueError, match=r"quantize.embedding.weight: checkpoint \[256, 8\] vs model \[512, 8\]"
    ):
        vq_from_official(tmp_path / "tiny.pt", **{**TINY, "codebook_size": 512})

    torch.save({"steps": 3}, tmp_path / "no_weights.pt")
    with pytest.raises(ValueError, match=r"no weights under \['model', 'module', 'state_dict', 'ema'\]"):
        vq_from_official(tmp_path / "no_weights.pt", **TINY)

    write_llamagen_vq(tmp_path / "l2.pt", args_overrides={"codebook_l2_norm": False})
    with pytest.raises(ValueError, match=r"l2_norm=True disagrees with .* args\.codebook_l2_norm=False"):
        vq_from_official(tmp_path / "l2.pt", codebook_l2_norm=True)
