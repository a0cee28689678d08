"""Every method's decode with the tiny models of test_mulo / test_eagle2 and fixed small knobs, shared by the
tests that compare decodes across code paths (test_stats_identity: pinned hashes; test_batched: batch against
single)."""

from mulo_sd.decoding.methods import decode_ar, decode_eagle2, decode_lantern, decode_mulo, decode_zipar
from tests.decoding.test_mulo import RepeatUpsampler, StridedDownsampler


def decode_method(name, models, cond, sampler, generator, neighbours, mulo_knobs=None):
    """models: (target, drafter, low-res drafter, EAGLE head); mulo_knobs: decode_mulo's knobs for a
    MuLo-SD `name` (any name but ar, zipar, lantern and eagle2)."""
    target, drafter, low_drafter, head = models
    if name == "ar":
        return decode_ar(target, cond, sampler, generator)
    if name == "zipar":
        return decode_zipar(target, cond, sampler, generator, window=2)
    if name == "lantern":
        return decode_lantern(
            target, drafter, cond, sampler, generator, k=2, delta=0.2, neighbours=neighbours, draft_len=3
        )
    if name == "eagle2":
        return decode_eagle2(target, head, cond, sampler, generator, depth=3, top_k=3, total_tokens=6)
    return decode_mulo(
        target, low_drafter, RepeatUpsampler(2), StridedDownsampler(2), cond, sampler, generator,
        neighbours=neighbours, **mulo_knobs,
    )  # fmt: skip
