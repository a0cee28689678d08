"""Codebook nearest-neighbour tables: for every token id, the ids of its closest codebook entries.

Both relaxed accept rules pool a token's probability with its neighbours' (accept.py): MuLo-SD's
`B_k(v)` = v plus its k nearest entries, LANTERN's latent-proximity set. Distance is Euclidean between the
codebook vectors as the tokenizer uses them (`VQModel.codebook`: unit-norm when the tokenizer normalises).

A table is built once per tokenizer with a column count `K` >= every k a decode will use (`k` selects its
first k columns) and can be cached next to the tokenizer with `cached_neighbours`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


@torch.no_grad()
def codebook_neighbours(codebook: torch.Tensor, k: int, chunk_size: int = 1024) -> torch.Tensor:
    """codebook [V, D] -> int64 [V, k] on the codebook's device: row v holds the k entries nearest to v
    (v itself excluded), nearest first; equal distances are ordered by id.

    Distances are computed in float32, `chunk_size` rows at a time, so a 16384-entry codebook needs no
    V x V matrix."""
    if codebook.dim() != 2 or codebook.shape[0] < 1:
        raise ValueError(f"codebook must be [V, D] with V >= 1, got shape {list(codebook.shape)}")
    size = codebook.shape[0]
    if not 0 <= k < size:
        raise ValueError(
            f"k must lie in [0, {size}) for a codebook of {size} entries (v itself is excluded), got {k}"
        )
    vectors = codebook.float()
    squared = vectors.pow(2).sum(1)
    table = torch.empty(size, k, dtype=torch.long, device=codebook.device)
    for start in range(0, size, chunk_size):
        rows = torch.arange(start, min(start + chunk_size, size), device=codebook.device)
        distances = squared[rows, None] + squared[None, :] - 2 * vectors[rows] @ vectors.t()
        distances[torch.arange(len(rows)), rows] = float("inf")  # not its own neighbour
        nearest = distances.topk(k, dim=1, largest=False).indices
        # make the order deterministic: by id, then (stable) by distance
        nearest = nearest.sort(dim=1).values
        order = distances.gather(1, nearest).sort(dim=1, stable=True).indices
        table[rows] = nearest.gather(1, order)
    return table


def cached_neighbours(codebook: torch.Tensor, k: int, path: str | Path) -> torch.Tensor:
    """The k-column table for `codebook`, read from `path` (a .safetensors file) when it was built for this
    very codebook with at least k columns, else built and written there. Returned on the codebook's device."""
    path = Path(path)
    vectors = codebook.detach().float().cpu()
    if path.is_file():
        stored = load_file(str(path))
        same_codebook = stored["codebook"].shape == vectors.shape and torch.equal(stored["codebook"], vectors)
        if same_codebook and stored["neighbours"].shape[1] >= k:
            return stored["neighbours"][:, :k].to(codebook.device)
    table = codebook_neighbours(codebook, k)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"neighbours": table.cpu().contiguous(), "codebook": vectors.contiguous()}, str(path))
    return table
