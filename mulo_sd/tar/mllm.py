"""Tar's first stage: a Qwen2-family MLLM writes a prompt's TA-Tok code grid; TA-Tok turns it into features.

    mllm = TarMLLM.from_pretrained("Tar-1.5B", "ta_tok.pth", device="cuda", dtype="bfloat16")
    ids, features = mllm.generate(["a photo of a macaw"], sampler=TAR_SAMPLER, generator=generator)
    # ids [B, 729] TA-Tok codes, features [B, 729, mllm.clip_dim]: the AR-DTok's condition prefix

Tar's conventions, as its code has them:
- Prompt (Tar's t2i_inference.py, `generate_image`): the tokenizer's chat template over a system message
  "You are a helpful assistant." and the user's prompt, with the generation prompt, then "<im_start><S{k}>";
  Tar's eval/eval_dpg_bench.py writes the same Qwen chat text out literally.
- Scale token <S{k}>, k = 0, 1, 2: 729, 169 or 81 codes (t2i_inference.py `seq_len`), the 27 x 27 SigLIP2
  grid average-pooled by k + 1 (t2i_inference.py sets pool_scale = k + 1; the grid: mulo_sd/tar/tatok.py).
- Image tokens "<I{n}>" for code n: Tar adds "<im_start>", "<im_end>", then the scale tokens, then
  <I0> ... <I{codebook size - 1}> to the tokenizer in that order (Tar's llava/model/llava_arch.py,
  `initialize_vision_tokenizer`), so codes are contiguous LM ids; "<im_end>" closes an image.
- Sampling (t2i_inference.py `T2IConfig`): temperature 1.0, top_k 1200, top_p 0.95 (`TAR_SAMPLER`); no
  guidance on the MLLM (T2IConfig's cfg_scale 4.0 goes to the AR-DTok only).

Where this differs from Tar, and why:
- Decoding is constrained to the image tokens for exactly h*w steps (HFCausalLM reads only the image-token
  logits), so sampling renormalises over them. Tar samples h*w new tokens over the whole vocabulary and keeps
  the <I..> ones, padding with code 0 or truncating: a stray text token there shifts the rest of the grid.
- Guidance is optional (cfg_scale 1 = off, Tar's setting). Tar has no unconditional MLLM prompt; here it is
  the same template with an empty user message.
- Prompts and the unconditional prompt have different lengths; they are left-padded to one length with a
  mask (HFCausalLM's cond_mask / uncond_mask) so one batch carries both halves of the guidance. Left, because
  the adapter puts the grid right after the prefix slots and a token's RoPE position is its slot: with left
  padding the prompt ends next to the grid in every row, and as RoPE sees only relative positions, a row's
  shift by its padding leaves its logits unchanged (up to rounding; tests/tar/test_tar_mllm.py checks this).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from transformers import AutoTokenizer, Qwen2ForCausalLM

from mulo_sd.decoding.methods.ar import decode_ar
from mulo_sd.decoding.sampling import SamplerConfig
from mulo_sd.decoding.stats import DecodeStats
from mulo_sd.nets.dtypes import resolve_dtype
from mulo_sd.nets.hf_adapter import HFCausalLM
from mulo_sd.tar.files import check_mllm_folder
from mulo_sd.tar.tatok import TATokDecoder

SYSTEM_MESSAGE = "You are a helpful assistant."
IMAGE_START, IMAGE_END = "<im_start>", "<im_end>"
SCALES = 3  # Tar's scale tokens <S0>, <S1>, <S2> (its training script's --num_scale_tokens)
TAR_SAMPLER = SamplerConfig(temperature=1.0, top_k=1200, top_p=0.95, cfg_scale=1.0)


class TarMLLM:
    def __init__(self, model, tokenizer, tatok: TATokDecoder, *, scale: int = 0, name: str = "the MLLM"):
        """model: a Qwen2ForCausalLM loaded with attn_implementation="sdpa"; name: its folder, for errors."""
        if scale not in range(SCALES):
            raise ValueError(f"scale must be one of {list(range(SCALES))} (Tar's <S0>..<S2>), got {scale}")
        self.model, self.tokenizer, self.tatok, self.scale = model, tokenizer, tatok, scale
        self.image_token_offset = _image_token_offset(tokenizer, tatok.codebook_size, name)
        needed = [IMAGE_START, f"<S{scale}>"]
        lacking = [
            token
            for token in needed
            if tokenizer.convert_tokens_to_ids(token) in (None, tokenizer.unk_token_id)
        ]
        if lacking:
            raise ValueError(f"{name}: the tokenizer lacks Tar's tokens {lacking}")
        if self.image_token_offset + tatok.codebook_size > model.config.vocab_size:
            raise ValueError(
                f"{name}: config.json vocab_size {model.config.vocab_size} has no rows for the image tokens "
                f"<I0>..<I{tatok.codebook_size - 1}> (ids {self.image_token_offset}..)"
            )

    @classmethod
    def from_pretrained(
        cls, folder: str | Path, tatok_path: str | Path, *, device="cpu", dtype="float32", scale: int = 0
    ) -> TarMLLM:
        """A local Tar MLLM folder (config.json, tokenizer files, weights) and the TA-Tok file."""
        check_mllm_folder(folder)
        dtype = resolve_dtype(dtype)
        model = Qwen2ForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa")
        tokenizer = AutoTokenizer.from_pretrained(folder)
        tatok = TATokDecoder.from_checkpoint(tatok_path, device=device, dtype=dtype)
        return cls(model.to(device).eval(), tokenizer, tatok, scale=scale, name=str(folder))

    @property
    def clip_dim(self) -> int:
        """Width of the features `generate` returns (the AR-DTok's clip projection input)."""
        return self.tatok.feature_dim

    @property
    def grid_size(self) -> tuple[int, int]:
        return (self.tatok.grid_side(self.scale),) * 2

    def prompt_text(self, prompt: str) -> str:
        """Tar's text-to-image prompt (module docstring); "" gives the unconditional one."""
        messages = [{"role": "system", "content": SYSTEM_MESSAGE}, {"role": "user", "content": prompt}]
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return f"{text}{IMAGE_START}<S{self.scale}>"

    def condition(self, prompts: list[str]) -> tuple[HFCausalLM, torch.Tensor, torch.Tensor]:
        """The adapter to decode `prompts` with (the unconditional prompt inside it), and the left-padded
        prompt ids [B, L] with their mask [B, L] for its `start` (module docstring)."""
        rows = [self.tokenizer(self.prompt_text(p))["input_ids"] for p in [*prompts, ""]]
        length = max(map(len, rows))
        ids = torch.full((len(rows), length), self.tokenizer.pad_token_id or 0, dtype=torch.long)
        mask = torch.zeros(len(rows), length, dtype=torch.bool)
        for i, row in enumerate(rows):
            ids[i, length - len(row) :] = torch.tensor(row)
            mask[i, length - len(row) :] = True
        adapter = HFCausalLM(
            self.model,
            self.grid_size,
            uncond=ids[-1],
            uncond_mask=mask[-1],
            image_token_offset=self.image_token_offset,
            vocab_size=self.tatok.codebook_size,
        )
        return adapter, ids[:-1].to(self.model.device), mask[:-1].to(self.model.device)

    def generate(
        self,
        prompts: list[str],
        *,
        sampler: SamplerConfig,
        generator: torch.Generator,
        stats: DecodeStats | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """TA-Tok codes [B, h*w] sampled in raster order (mulo_sd/decoding/methods/ar.py) and their TA-Tok
        features
        [B, h*w, clip_dim]. stats: the caller's record of this stage (its batch_size already counts the
        prompts): the decode's model calls and times are added to it, the feature decode as phase "tatok"."""
        adapter, ids, mask = self.condition(prompts)
        result = decode_ar(adapter, ids, sampler, generator, cond_mask=mask)
        codes = result.tokens.flatten(1)
        record = replace(result.stats, batch_size=0)
        with record.wall(), record.phase("tatok"):
            features = self.tatok(codes)
        if stats is not None:
            stats.add(record)
        return codes, features


def _image_token_offset(tokenizer, count: int, name: str) -> int:
    """The LM id of <I0>, after checking that <I0>..<I{count-1}> are consecutive ids."""
    ids = tokenizer.convert_tokens_to_ids([f"<I{n}>" for n in range(count)])
    first = ids[0]
    if first is None or first == tokenizer.unk_token_id or ids != list(range(first, first + count)):
        raise ValueError(
            f"{name}: the tokenizer lacks Tar's image tokens <I0>..<I{count - 1}> as consecutive ids "
            f"(one per TA-Tok code; codebook size {count})"
        )
    return first
