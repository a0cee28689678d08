"""Tiny random checkpoints in the official file layouts, and a tiny random FLAN-T5 folder, for tests that must
not download anything.

Key names and shapes follow LlamaGen's code (autoregressive/models/gpt.py `Transformer`,
tokenizer/tokenizer_image/vq_model.py `VQModel`), Tar AR-DTok's (`ARModel`, saved as a `models.make` spec)
and the training scripts' `torch.save` calls. They are written out here, independently of mulo_sd's model
classes, so a layout mistake on either side shows up as a loading error.

Writers return the state dict they saved under "model" (and write a different one under "ema" when asked).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

# One tiny family that fits together: VQ codebook = GPT vocabulary, T5 width = GPT caption width.
CODEBOOK = 64
CODE_DIM = 8
CAPTION_DIM = 16
GPT_DIM, GPT_LAYERS, GPT_HEADS = 64, 2, 4
UNCOND_ROWS = 120  # LlamaGen's CaptionEmbedder token_num, whatever cls_token_num is
TINY_GPT_NAME = "GPT-tiny"  # not in LlamaGen's size table: loaders need n_head=GPT_HEADS
VQ_CH, VQ_Z = 32, 32  # channels; GroupNorm(32) needs multiples of 32
VQ16_MULT = (1, 1, 2, 2, 4)

T5_WORDS = [
    "a",
    "red",
    "blue",
    "green",
    "circle",
    "star",
    "square",
    "on",
    "the",
    "left",
    "of",
    "big",
    "small",
]


def _random(shapes: dict[str, tuple[int, ...]], seed: int, scale: float = 0.2) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=generator) * scale for name, shape in shapes.items()}


# ---- LlamaGen GPT ---------------------------------------------------------------------------------------


def llamagen_gpt_shapes(
    dim: int = GPT_DIM,
    n_layer: int = GPT_LAYERS,
    n_head: int = GPT_HEADS,
    vocab_size: int = CODEBOOK,
    caption_dim: int | None = CAPTION_DIM,
    num_classes: int = 10,
    n_kv_head: int | None = None,
    multiple_of: int = 256,
) -> dict[str, tuple[int, ...]]:
    """LlamaGen Transformer's state-dict shapes: t2i (caption_dim set) or c2i (caption_dim None, with the
    null-class row of class_dropout_prob > 0). freqs_cis and the KV caches are not in the state dict."""
    head_dim, kv = dim // n_head, n_kv_head or n_head
    hidden = int(2 * 4 * dim / 3)
    hidden = hidden if hidden % multiple_of == 0 else hidden + multiple_of - hidden % multiple_of
    shapes: dict[str, tuple[int, ...]] = {"tok_embeddings.weight": (vocab_size, dim)}
    if caption_dim is None:
        shapes["cls_embedding.embedding_table.weight"] = (num_classes + 1, dim)
    else:
        shapes["cls_embedding.cap_proj.fc1.weight"] = (dim, caption_dim)
        shapes["cls_embedding.cap_proj.fc2.weight"] = (dim, dim)
        shapes["cls_embedding.uncond_embedding"] = (UNCOND_ROWS, caption_dim)
    for i in range(n_layer):
        shapes[f"layers.{i}.attention.wqkv.weight"] = ((n_head + 2 * kv) * head_dim, dim)
        shapes[f"layers.{i}.attention.wo.weight"] = (dim, dim)
        shapes[f"layers.{i}.feed_forward.w1.weight"] = (hidden, dim)
        shapes[f"layers.{i}.feed_forward.w3.weight"] = (hidden, dim)
        shapes[f"layers.{i}.feed_forward.w2.weight"] = (dim, hidden)
        shapes[f"layers.{i}.attention_norm.weight"] = (dim,)
        shapes[f"layers.{i}.ffn_norm.weight"] = (dim,)
    shapes["norm.weight"] = (dim,)
    shapes["output.weight"] = (vocab_size, dim)
    return shapes


def llamagen_t2i_args(image_size: int, cls_token_num: int, **overrides) -> argparse.Namespace:
    """The argparse.Namespace train_t2i.py saves as "args" (its arguments that matter here, plus paths)."""
    fields = dict(
        data_path="/data/laion-coco",
        t5_feat_path="/data/t5_feats",
        cloud_save_path="/ckpts",
        vq_model="VQ-16",
        codebook_size=CODEBOOK,
        codebook_embed_dim=CODE_DIM,
        gpt_model=TINY_GPT_NAME,
        gpt_type="t2i",
        vocab_size=CODEBOOK,
        cls_token_num=cls_token_num,
        dropout_p=0.1,
        token_dropout_p=0.1,
        image_size=image_size,
        downsample_size=16,
        num_classes=1000,
        lr=1e-4,
        global_batch_size=256,
        mixed_precision="bf16",
    )
    return argparse.Namespace(**{**fields, **overrides})


def write_llamagen_gpt(
    path: str | Path,
    image_size: int = 32,
    cls_token_num: int = 120,
    *,
    args: bool = True,
    ema: bool = False,
    seed: int = 0,
    args_overrides: dict | None = None,
    **shape_fields,
) -> dict[str, torch.Tensor]:
    """A LlamaGen t2i GPT file. args=True: a training checkpoint as train_t2i.py saves it ("model",
    "optimizer", "steps", "args"); args=False: a release file ({"model": ...}, settings given by flags)."""
    state = _random(llamagen_gpt_shapes(**shape_fields), seed)
    checkpoint = {"model": state}
    if args:
        namespace = llamagen_t2i_args(image_size, cls_token_num, **(args_overrides or {}))
        checkpoint.update(optimizer=_optimizer_state(), steps=5000, args=namespace)
    if ema:
        checkpoint["ema"] = _random(llamagen_gpt_shapes(**shape_fields), seed + 1000)
    torch.save(checkpoint, path)
    return state


def _optimizer_state() -> dict:
    """An AdamW state dict as torch writes it (ints, floats, tuples, bools, None, tensors), as the training
    checkpoints carry one."""
    group = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.05, amsgrad=False, maximize=False)
    group.update(foreach=None, capturable=False, differentiable=False, fused=None, params=[0])
    moments = {"step": torch.tensor(5000.0), "exp_avg": torch.zeros(2), "exp_avg_sq": torch.zeros(2)}
    return {"state": {0: moments}, "param_groups": [group]}


# ---- Tar AR-DTok ----------------------------------------------------------------------------------------


def write_tar_ar_dtok(
    path: str | Path, grid: int = 2, cls_token_num: int = 9, *, name: str = "llama-abs-tiny", seed: int = 0
) -> dict[str, torch.Tensor]:
    """A Tar AR-DTok file, {"model": {"name", "args", "sd"}}; abs_pe: max_seq_len + cls_token_num - 1 rows."""
    shapes = llamagen_gpt_shapes(caption_dim=None)
    del shapes["cls_embedding.embedding_table.weight"]
    shapes.update({"clip_proj.weight": (GPT_DIM, CAPTION_DIM), "clip_proj.bias": (GPT_DIM,)})
    shapes["abs_pe"] = (1, grid * grid + cls_token_num - 1, GPT_DIM)
    state = _random(shapes, seed)
    spec_args = dict(
        vocab_size=CODEBOOK,
        cls_token_num=cls_token_num,
        max_seq_len=grid * grid,
        model_type="clip_cond",
        cond_dim=CAPTION_DIM,
    )
    torch.save({"model": {"name": name, "args": spec_args, "sd": state}}, path)
    return state


# ---- LlamaGen VQ ----------------------------------------------------------------------------------------


class _VQShapes(dict):
    """State-dict shapes of LlamaGen's VQ modules, added in the order its state dict lists them."""

    def conv(self, name, cin, cout, k):
        self[f"{name}.weight"], self[f"{name}.bias"] = (cout, cin, k, k), (cout,)

    def norm(self, name, c):
        self[f"{name}.weight"], self[f"{name}.bias"] = (c,), (c,)

    def resnet(self, name, cin, cout):
        self.norm(f"{name}.norm1", cin), self.conv(f"{name}.conv1", cin, cout, 3)
        self.norm(f"{name}.norm2", cout), self.conv(f"{name}.conv2", cout, cout, 3)
        if cin != cout:
            self.conv(f"{name}.nin_shortcut", cin, cout, 1)

    def attn(self, name, c):
        self.norm(f"{name}.norm", c)
        for proj in ("q", "k", "v", "proj_out"):
            self.conv(f"{name}.{proj}", c, c, 1)

    def mid(self, name, c):
        self.resnet(f"{name}.0", c, c), self.attn(f"{name}.1", c), self.resnet(f"{name}.2", c, c)

    def encoder(self, ch, z_channels, ch_mult, num_res_blocks):
        levels = len(ch_mult)
        self.conv("encoder.conv_in", 3, ch, 3)
        block_in = ch
        for level, mult in enumerate(ch_mult):
            for j in range(num_res_blocks):
                self.resnet(f"encoder.conv_blocks.{level}.res.{j}", block_in, ch * mult)
                block_in = ch * mult
                if level == levels - 1:
                    self.attn(f"encoder.conv_blocks.{level}.attn.{j}", block_in)
            if level != levels - 1:
                self.conv(f"encoder.conv_blocks.{level}.downsample.conv", block_in, block_in, 3)
        self.mid("encoder.mid", block_in)
        self.norm("encoder.norm_out", block_in)
        self.conv("encoder.conv_out", block_in, z_channels, 3)

    def decoder(self, ch, z_channels, ch_mult, num_res_blocks):
        levels = len(ch_mult)
        block_in = ch * ch_mult[-1]
        self.conv("decoder.conv_in", z_channels, block_in, 3)
        self.mid("decoder.mid", block_in)
        for i in range(levels):
            for j in range(num_res_blocks + 1):
                self.resnet(f"decoder.conv_blocks.{i}.res.{j}", block_in, ch * ch_mult[levels - 1 - i])
                block_in = ch * ch_mult[levels - 1 - i]
                if i == 0:
                    self.attn(f"decoder.conv_blocks.{i}.attn.{j}", block_in)
            if i != levels - 1:
                self.conv(f"decoder.conv_blocks.{i}.upsample.conv", block_in, block_in, 3)
        self.norm("decoder.norm_out", block_in)
        self.conv("decoder.conv_out", block_in, 3, 3)


def llamagen_vq_shapes(
    ch: int = VQ_CH,
    z_channels: int = VQ_Z,
    ch_mult: tuple[int, ...] = VQ16_MULT,
    num_res_blocks: int = 2,
    codebook_size: int = CODEBOOK,
    codebook_embed_dim: int = CODE_DIM,
) -> dict[str, tuple[int, ...]]:
    """LlamaGen VQModel's state-dict shapes (Encoder, Decoder, VectorQuantizer with codebook_show_usage)."""
    shapes = _VQShapes()
    shapes.encoder(ch, z_channels, ch_mult, num_res_blocks)
    shapes.decoder(ch, z_channels, ch_mult, num_res_blocks)
    shapes["quantize.embedding.weight"] = (codebook_size, codebook_embed_dim)
    shapes["quantize.codebook_used"] = (65536,)
    shapes.conv("quant_conv", z_channels, codebook_embed_dim, 1)
    shapes.conv("post_quant_conv", codebook_embed_dim, z_channels, 1)
    return dict(shapes)


def vq_args(**overrides) -> argparse.Namespace:
    """The argparse.Namespace vq_train.py saves as "args" (its model arguments, plus paths)."""
    fields = dict(
        data_path="/data/imagenet",
        cloud_save_path="/ckpts",
        vq_model="VQ-16",
        ema=True,
        codebook_size=CODEBOOK,
        codebook_embed_dim=CODE_DIM,
        codebook_l2_norm=True,
        codebook_weight=1.0,
        entropy_loss_ratio=0.0,
        commit_loss_beta=0.25,
        dropout_p=0.0,
        image_size=256,
        disc_start=20000,
    )
    return argparse.Namespace(**{**fields, **overrides})


def write_llamagen_vq(
    path: str | Path,
    *,
    args: bool = True,
    ema: bool = False,
    seed: int = 0,
    args_overrides: dict | None = None,
) -> dict[str, torch.Tensor]:
    """A LlamaGen VQ file. args=True: a training checkpoint as vq_train.py saves it ("model", "optimizer",
    "discriminator", "optimizer_disc", "steps", "args", and "ema" with ema=True); args=False: {"model": ...}.
    The codebook is L2-normalised and `codebook_used` holds ids, as in a trained tokenizer."""
    state = _vq_state(seed)
    checkpoint = {"model": state}
    if args:
        checkpoint.update(
            optimizer=_optimizer_state(),
            discriminator=_random({"main.0.weight": (4, 3, 4, 4), "main.0.bias": (4,)}, seed + 1),
            optimizer_disc=_optimizer_state(),
            steps=20000,
            args=vq_args(**(args_overrides or {})),
        )
    if ema:
        checkpoint["ema"] = _vq_state(seed + 1000)
    torch.save(checkpoint, path)
    return state


def _vq_state(seed: int) -> dict[str, torch.Tensor]:
    state = _random(llamagen_vq_shapes(), seed, scale=0.05)
    state["quantize.embedding.weight"] = torch.nn.functional.normalize(
        state["quantize.embedding.weight"], dim=-1
    )
    state["quantize.codebook_used"] = torch.arange(65536, dtype=torch.float32) % CODEBOOK
    for name, tensor in state.items():  # GroupNorm scales near 1, as trained
        if name.endswith(("norm1.weight", "norm2.weight", "norm.weight", "norm_out.weight")):
            tensor.add_(1.0)
    return state


# ---- FLAN-T5 --------------------------------------------------------------------------------------------


def write_tiny_t5(folder: str | Path, d_model: int = CAPTION_DIM, seed: int = 0) -> Path:
    """A random T5 (encoder-decoder, as google/flan-t5-xl ships) and a fast T5 tokenizer, saved with
    `save_pretrained` as config.json, model.safetensors, tokenizer.json, tokenizer_config.json and
    special_tokens_map.json.

    The tokenizer is built offline from a `tokenizers` Unigram model over a few words and the letters,
    with T5's Metaspace pre-tokenizer and its "$A </s>" post-processor (ids: 0 <pad>, 1 </s>, 2 <unk>), and
    wrapped as a T5TokenizerFast without extra ids; no sentencepiece model is needed."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import T5Config, T5ForConditionalGeneration, T5TokenizerFast

    folder = Path(folder)
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    pieces += [(f"\u2581{word}", -2.0) for word in T5_WORDS]
    pieces += [(char, -8.0) for char in "\u2581abcdefghijklmnopqrstuvwxyz"]
    backend = Tokenizer(models.Unigram(pieces, unk_id=2))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    backend.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)]
    )
    tokenizer = T5TokenizerFast(
        tokenizer_object=backend, eos_token="</s>", pad_token="<pad>", unk_token="<unk>", extra_ids=0
    )
    tokenizer.save_pretrained(folder)
    config = T5Config(
        vocab_size=len(pieces),
        d_model=d_model,
        d_kv=4,
        d_ff=32,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        feed_forward_proj="gated-gelu",  # FLAN-T5's
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    torch.manual_seed(seed)
    T5ForConditionalGeneration(config).save_pretrained(folder)
    return folder
