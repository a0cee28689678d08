"""The output folder of a command that writes shards: one dataset per folder.

Shards written into a folder that holds other shards would mix with them, and their counts would merge into
its sizes.json. So a non-empty --out is refused; --overwrite deletes the command's own shards (and files)
there first and keeps every other file; a command may accept some non-empty folders itself (synthscenes'
--start-index adds scenes of the same seed).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterable

from mulo_sd.data.shards import SIZES_NAME, update_sizes


def prepare_out_folder(
    command: str,
    out: str,
    prefix: str,
    overwrite: bool,
    owned: Iterable[str] = (),
    may_add: Callable[[list[str]], bool] | None = None,
    alternative: str = ", or give an empty --out",
) -> None:
    """Let `command` write shards `prefix-NNNNNN.tar` into `out`: an empty or missing folder is fine; with
    `overwrite` its `prefix` shards and the `owned` files are deleted first; otherwise a non-empty folder is
    refused unless `may_add(its entries)` accepts it (`alternative` ends the error with the way out)."""
    entries = sorted(os.listdir(out)) if os.path.isdir(out) else []
    if not entries:
        return
    if overwrite:
        remove_shards(out, prefix, owned)
        return
    if may_add is not None and may_add(entries):
        return
    raise SystemExit(
        f"mulo-data {command}: {out} is not empty ({len(entries)} entries, e.g. {entries[0]}): pass "
        f"--overwrite to delete its {prefix}-*.tar shards first (other files are kept){alternative}"
    )


def remove_shards(out: str, prefix: str, owned: Iterable[str] = ()) -> None:
    """Delete `out`'s shards `prefix-NNNNNN.tar` (and unfinished `.partial` ones) and the `owned` files; drop
    them from sizes.json, keeping other shards' entries."""
    ours = re.compile(rf"{re.escape(prefix)}-\d+\.tar(\.partial)?")
    for name in [*filter(ours.fullmatch, os.listdir(out)), *owned]:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(out, name))
    if os.path.isfile(os.path.join(out, SIZES_NAME)):
        update_sizes(out, {})
