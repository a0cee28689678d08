"""SynthScenes in the shared cache, rendered as far as runs read them.

A data config names a dataset of `count` scenes (conf/data/synthscenes.yaml: 40,000 for training). A run
renders only the first shards of it that it reads (`needed` scenes, rounded up to whole shards), and a later
run that reads more appends the next shards under the same seed. Scene i depends on (seed, i) only and shard j
always holds scenes [j * shard_size, (j + 1) * shard_size), so a cache grown in steps holds the same shards,
byte for byte, as one render of all of them. A run's shard spec depends only on its own settings, never on
how far the cache has grown, so a resumed run reads the same shards. Locking and the manifest: generated.py.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os

from mulo_sd.data.cli import (
    SYNTHSCENES_MANIFEST,
    SYNTHSCENES_PREFIX,
    check_synthscenes_arguments,
    render_synthscenes,
    synthscenes_shards,
)
from mulo_sd.data.generated import GrowingData, ensure_generated
from mulo_sd.data.shards import SIZES_NAME, shard_spec, update_sizes


def ensure_synthscenes(
    out: str, count: int, seed: int, size: int, shard_size: int = 1000, needed: int | None = None
) -> str:
    """Make sure `out` holds the first shards of `count` SynthScenes that cover `needed` scenes (None: all
    of them), rendering the missing ones; return the spec of those shards.

    Training configs call this so the testbed's data appears on demand. A folder of scenes made with other
    arguments is an error rather than silently reused. Safe when several runs ask at once (one renders,
    the others wait and reuse it; see data/generated.py)."""
    scenes = scenes_to_render(count, shard_size, needed)

    def covers(rendered: int | None) -> bool:  # None: a manifest of a whole render, from before folders grew
        return (count if rendered is None else rendered) >= scenes

    def render(folder: str, rendered: int | None) -> int:
        start = rendered or 0
        remove_unclaimed_shards(folder, start // shard_size)
        args = argparse.Namespace(
            out=folder,
            count=scenes - start,
            seed=seed,
            size=size,
            shard_size=shard_size,
            workers=os.cpu_count() or 1,
            start_index=start,
            overwrite=False,
        )
        check_synthscenes_arguments(args)
        render_synthscenes(args)
        print(f"wrote SynthScenes {start}..{scenes - 1} of {count} (seed {seed}, {size} px) to {out}")
        return scenes

    identity = {"count": count, "seed": seed, "size": size, "shard_size": shard_size}
    scenes_data = GrowingData(SYNTHSCENES_MANIFEST, identity, "rendered", covers, render, "SynthScenes")
    ensure_generated(out, scenes_data)
    return shard_spec(out, [f"{SYNTHSCENES_PREFIX}-{i:06d}.tar" for i in range(-(-scenes // shard_size))])


def scenes_to_render(count: int, shard_size: int, needed: int | None) -> int:
    """The scenes of the first shards that hold `needed` scenes (at least one shard, at most all `count`)."""
    if needed is None:
        return count
    return min(count, max(1, math.ceil(needed / shard_size)) * shard_size)


def remove_unclaimed_shards(folder: str, first: int) -> None:
    """Delete what a killed extension left: shards from number `first` on, and unfinished files."""
    unclaimed = [name for name, number in synthscenes_shards(folder).items() if number >= first]
    unclaimed += [name for name in os.listdir(folder) if name.endswith(".partial")]
    for name in unclaimed:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(folder, name))
    if unclaimed and os.path.isfile(os.path.join(folder, SIZES_NAME)):
        update_sizes(folder, {})
