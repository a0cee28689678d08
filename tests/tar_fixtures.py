"""Tiny random Tar first-stage files for tests that must not download anything: a Qwen2 MLLM folder with
Tar's added tokens, and a TA-Tok checkpoint in Tar's key layout.

Layouts follow Tar's code, written out here independently of mulo_sd's loaders:
- MLLM folder: `save_pretrained` of a Qwen2ForCausalLM and of a fast tokenizer to which "<im_start>",
  "<im_end>" (special), the scale tokens <S0>..<S2> and the image tokens <I0>.. are added in that order, as
  Tar's llava/model/llava_arch.py `initialize_vision_tokenizer` does. The tokenizer is a byte-level BPE
  without merges (every byte one token; Qwen's pre-tokenizer family) with Qwen's ChatML chat template.
- TA-Tok file: `torch.save({"model": {"args": ..., "sd": ...}})` as Tar's tok/ta_tok.py
  `TextAlignedTokenizer.from_checkpoint` reads it, with every module of `TextAlignedTokenizer` present: the
  SigLIP2 encoder (only its embeddings here, which fix the code grid), `encode_task_layer`, the bottleneck
  (`in_linear`, `out_linear`, the SimVQ `regularizer.embedding` / `embedding_proj`), the SigLIP2 decoder
  with its pooling head (transformers' Siglip2VisionModel, as Tar builds it) and `decode_task_layer`.
"""

from __future__ import annotations

from pathlib import Path

import torch
import yaml
from mulo_sd.training.config import CONFIG_DIR

from mulo_sd.llamagen.convert import main as convert
from mulo_sd.nets.downsampler import Downsampler, DownsamplerConfig
from mulo_sd.nets.upsampler import Upsampler, UpsamplerConfig
from mulo_sd.nets.vq import VQModel
from tests.official_fixtures import CAPTION_DIM, GPT_HEADS, write_llamagen_vq, write_tar_ar_dtok

TATOK_CODES = 16  # codebook size = number of <I{n}> tokens
TATOK_CODE_DIM = 8  # the SimVQ codebook's width (Tar's bottleneck_dim)
TATOK_SIDE = 3  # the encoder's patch grid: 3 x 3 codes at <S0>
TATOK_TOKENS = TATOK_SIDE**2
TATOK_DECODER_PATCHES = 16  # the decoder's position table (4 x 4, resized to the code grid)
SIGLIP2_HEADS = 12  # Siglip2VisionConfig's default, which Tar's decoder keeps
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{'<|im_start|>assistant\n'}}"
    "{% endif %}"
)


def write_tatok_file(
    path: str | Path,
    feature_dim: int = CAPTION_DIM,
    *,
    codebook_size: int = TATOK_CODES,
    l2_normalized: bool = True,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """A TA-Tok checkpoint whose features are `feature_dim` wide; returns the state dict saved under "sd".

    A width that is not a multiple of SigLIP2's 12 heads gets 4 heads, recorded as args.decoder_num_heads
    (Tar's files store no head count)."""
    from transformers import Siglip2VisionConfig, Siglip2VisionModel

    heads = SIGLIP2_HEADS if feature_dim % SIGLIP2_HEADS == 0 else 4
    generator = torch.Generator().manual_seed(seed)

    def linear(prefix: str, fan_out: int, fan_in: int) -> dict[str, torch.Tensor]:
        return {
            f"{prefix}.weight": torch.randn(fan_out, fan_in, generator=generator) / fan_in**0.5,
            f"{prefix}.bias": torch.randn(fan_out, generator=generator) * 0.1,
        }

    torch.manual_seed(seed)
    decoder = Siglip2VisionModel(
        Siglip2VisionConfig(
            hidden_size=feature_dim,
            intermediate_size=2 * feature_dim,
            num_hidden_layers=2,
            num_attention_heads=heads,
            num_channels=TATOK_CODE_DIM,
            num_patches=TATOK_DECODER_PATCHES,
            patch_size=1,
        )
    )
    state = {
        "encoder.embeddings.patch_embedding.weight": torch.randn(
            feature_dim, 3 * 14 * 14, generator=generator
        ),
        "encoder.embeddings.position_embedding.weight": torch.randn(
            TATOK_TOKENS, feature_dim, generator=generator
        ),
        **linear("encode_task_layer.0", feature_dim, feature_dim),
        **linear("bottleneck.in_linear", TATOK_CODE_DIM, feature_dim),
        **linear("bottleneck.out_linear", TATOK_CODE_DIM, TATOK_CODE_DIM),
        "bottleneck.regularizer.embedding.weight": torch.randn(
            codebook_size, TATOK_CODE_DIM, generator=generator
        ),
        **linear("bottleneck.regularizer.embedding_proj", TATOK_CODE_DIM, TATOK_CODE_DIM),
        **{f"decoder.{key}": value for key, value in decoder.state_dict().items()},
        **linear("decode_task_layer.0", feature_dim, feature_dim),
        **linear("decode_task_layer.2", feature_dim, feature_dim),
        "scale_layer.shift": torch.full((1, 3, 1, 1), 0.5),
        "scale_layer.scale": torch.full((1, 3, 1, 1), 0.5),
    }
    regularizer = {"name": "simvq", "args": {"codebook_size": codebook_size, "l2_normalized": l2_normalized}}
    args = {
        "bottleneck": {
            "name": "bottleneck",
            "args": {"bottleneck_dim": TATOK_CODE_DIM, "regularizer": regularizer},
        },
        "bottleneck_token_num": TATOK_TOKENS,
        "teacher": "google/siglip2-so400m-patch14-384",
        "decoder_depth": 2,
    }
    if heads != SIGLIP2_HEADS:
        args["decoder_num_heads"] = heads
    torch.save({"model": {"args": args, "sd": state}}, path)
    return state


def write_tiny_tar_mllm(
    folder: str | Path, codebook_size: int = TATOK_CODES, *, image_tokens: bool = True, seed: int = 0
) -> Path:
    """A random Qwen2 causal LM and its tokenizer with Tar's added tokens (module docstring), saved with
    `save_pretrained`; image_tokens=False leaves the <I{n}> tokens out."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    folder = Path(folder)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHATML
    )
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.add_tokens(["<im_start>", "<im_end>"], special_tokens=True)
    tokenizer.add_tokens([f"<S{k}>" for k in range(3)])
    if image_tokens:
        tokenizer.add_tokens([f"<I{n}>" for n in range(codebook_size)])
    tokenizer.save_pretrained(folder)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.2,  # spread-out logits: no near-ties for greedy decoding to trip on
        tie_word_embeddings=True,  # as Qwen2.5-1.5B
    )
    torch.manual_seed(seed)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    return folder


# ---- the AR-DTok model sets (tests/tar/test_tar_set.py) ------------------------------------------------
# conf/models/tar_512.yaml and tar_1024.yaml made tiny, the way a user makes the real ones: official-layout
# AR-DTok and VQ files converted with `mulo-convert`, random samplers for the VQ, and the MLLM and TA-Tok
# above. Grids: 1024 px -> 8x8, 512 px -> 4x4, 256 px -> 2x2 tokens (the tiny ds16 VQ at 128, 64, 32 px);
# every AR-DTok takes the TATOK_TOKENS features of the tiny TA-Tok's <S0>.

TAR_SETS = ("tar_512", "tar_1024")
_BASE = yaml.safe_load((CONFIG_DIR / "models" / "tar_1024.yaml").read_text())["folders"]
TAR_FOLDERS = {
    "tar_1024": _BASE,
    "tar_512": {**_BASE, **yaml.safe_load((CONFIG_DIR / "models" / "tar_512.yaml").read_text())["folders"]},
}
TAR_GRIDS = {"tar_512": {"target": 4, "drafter_r2": 2}, "tar_1024": {"target": 8, "drafter_r4": 2}}
SMALL_AR_DTOK = "ar_dtok_small_64px"  # LANTERN's drafter for tar_512: another AR-DTok at the target's grid


def write_tar_set(root: Path) -> Path:
    """Every folder and file both Tar sets name, under root (official files under root/official)."""
    official = root / "official"
    official.mkdir(parents=True)
    write_llamagen_vq(official / "vq_ds16_t2i.pt")
    assert convert(["llamagen-vq", str(official / "vq_ds16_t2i.pt"), str(root / _BASE["vq"])]) == 0
    ar_dtoks = {
        TAR_FOLDERS["tar_1024"]["target"]: 8,
        TAR_FOLDERS["tar_512"]["target"]: 4,
        TAR_FOLDERS["tar_512"]["drafter_r2"]: 2,
        SMALL_AR_DTOK: 4,
    }
    for seed, (folder, grid) in enumerate(ar_dtoks.items()):
        source = official / f"{folder}.pth"
        write_tar_ar_dtok(source, grid=grid, cls_token_num=TATOK_TOKENS, seed=seed)
        assert convert(["tar-ar-dtok", str(source), str(root / folder), "--n-head", str(GPT_HEADS)]) == 0
    vq = VQModel.from_pretrained(root / _BASE["vq"])
    torch.manual_seed(0)
    for name, r in (("tar_512", 2), ("tar_1024", 4)):
        fields = dict(r=r, codebook_size=vq.codebook_size, code_dim=vq.code_dim, width=16, blocks=1)
        folders = TAR_FOLDERS[name]
        codebook = vq.codebook.detach()
        Upsampler(UpsamplerConfig(**fields), codebook).save_pretrained(root / folders[f"upsampler_r{r}"])
        down = Downsampler(DownsamplerConfig(**fields), codebook)
        down.save_pretrained(root / folders[f"downsampler_r{r}"])
    write_tiny_tar_mllm(root / _BASE["mllm"])
    write_tatok_file(root / _BASE["tatok"], feature_dim=CAPTION_DIM)
    return root


def tar_overrides(root: Path, name: str, *extra: str) -> list[str]:
    """Entry-point overrides for a tiny Tar set on the CPU in float32 (tar_512 with LANTERN's drafter)."""
    small = [f"models.folders.drafter_small={SMALL_AR_DTOK}"] if name == "tar_512" else []
    cpu = ["models.device=cpu", "models.dtype=float32"]
    return [f"models={name}", f"models.root={root}", *cpu, *small, *extra]
