"""The VQ tokenizer's config: LlamaGen's `ModelArgs` fields (defaults: its VQ-16) and its presets."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class VQConfig:
    """Field names up to `dropout_p` are LlamaGen's `ModelArgs`; the defaults are its VQ-16."""

    codebook_size: int = 16384
    codebook_embed_dim: int = 8
    codebook_l2_norm: bool = True
    codebook_show_usage: bool = True  # keeps LlamaGen's `quantize.codebook_used` buffer
    commit_loss_beta: float = 0.25
    entropy_loss_ratio: float = 0.0
    encoder_ch_mult: list[int] = field(default_factory=lambda: [1, 1, 2, 2, 4])
    decoder_ch_mult: list[int] = field(default_factory=lambda: [1, 1, 2, 2, 4])
    z_channels: int = 256
    dropout_p: float = 0.0
    ch: int = 128  # base channel count (LlamaGen's Encoder/Decoder default)
    num_res_blocks: int = 2
    norm_groups: int = 32  # GroupNorm groups; LlamaGen uses 32, small channel counts may want fewer

    def __post_init__(self):
        # Hydra and JSON hand over list-likes; keep plain int lists so the config serialises as written
        self.encoder_ch_mult = [int(m) for m in self.encoder_ch_mult]
        self.decoder_ch_mult = [int(m) for m in self.decoder_ch_mult]
        if not self.encoder_ch_mult or len(self.encoder_ch_mult) != len(self.decoder_ch_mult):
            raise ValueError(
                f"encoder_ch_mult {self.encoder_ch_mult} and decoder_ch_mult {self.decoder_ch_mult} must be "
                f"non-empty and of equal length (the decoder upsamples as often as the encoder downsamples)"
            )
        channels = sorted({self.ch * m for m in self.encoder_ch_mult + self.decoder_ch_mult})
        indivisible = [c for c in channels if c % self.norm_groups]
        if indivisible:
            raise ValueError(
                f"norm_groups={self.norm_groups} must divide every channel count {channels}; "
                f"{indivisible} are not divisible (lower norm_groups or change ch / ch_mult)"
            )

    @property
    def downsample_factor(self) -> int:
        return 2 ** (len(self.encoder_ch_mult) - 1)

    @classmethod
    def llamagen_ds16(cls, **overrides) -> VQConfig:
        """LlamaGen's `VQ_16` (the architecture of vq_ds16_t2i.pt and vq_ds16_c2i.pt)."""
        return cls(**{"encoder_ch_mult": [1, 1, 2, 2, 4], "decoder_ch_mult": [1, 1, 2, 2, 4], **overrides})

    @classmethod
    def llamagen_ds8(cls, **overrides) -> VQConfig:
        """LlamaGen's `VQ_8`."""
        return cls(**{"encoder_ch_mult": [1, 2, 2, 4], "decoder_ch_mult": [1, 2, 2, 4], **overrides})
