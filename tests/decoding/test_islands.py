from collections import deque

import numpy as np
import pytest
import torch

from mulo_sd.decoding.islands import expand_rejections, find_islands, label_components


def random_masks():
    generator = np.random.default_rng(0)
    shapes = [(1, 1), (1, 9), (9, 1), (5, 7), (8, 8), (16, 12)]
    for shape in shapes:
        for density in (0.0, 0.2, 0.45, 0.7, 1.0):
            yield generator.random(shape) < density


def flood_fill_labels(mask: np.ndarray) -> tuple[np.ndarray, int]:
    """Reference: breadth-first flood fill over the 8 neighbours, components numbered in the raster order of
    their first positions (the pure-Python search label_components used before scipy)."""
    height, width = mask.shape
    labels = np.zeros((height, width), dtype=np.int64)
    count = 0
    for row, col in zip(*np.nonzero(mask), strict=True):
        if labels[row, col]:
            continue
        count += 1
        labels[row, col] = count
        queue = deque([(row, col)])
        while queue:
            r, c = queue.popleft()
            for nr in range(max(r - 1, 0), min(r + 2, height)):
                for nc in range(max(c - 1, 0), min(c + 2, width)):
                    if mask[nr, nc] and not labels[nr, nc]:
                        labels[nr, nc] = count
                        queue.append((nr, nc))
    return labels, count


def test_labels_equal_the_flood_fill_reference_in_raster_order():
    generator = np.random.default_rng(0)
    shapes = [*(mask.shape for mask in random_masks()), (64, 64), (33, 64), (64, 17)]
    checked = 0
    for shape in shapes:
        for density in (0.0, 0.15, 0.35, 0.55, 1.0):
            mask = generator.random(shape) < density
            labels, count = label_components(torch.from_numpy(mask))
            reference, reference_count = flood_fill_labels(mask)
            assert count == reference_count and labels.dtype == torch.long
            assert np.array_equal(labels.numpy(), reference)  # the same numbers, not only the same partition
            checked += count > 1
    assert checked >= 20  # many masks with several components


def test_diagonal_touch_connects_but_gap_does_not():
    mask = torch.tensor([[1, 0, 0, 0], [0, 1, 0, 1], [0, 0, 0, 1]], dtype=torch.bool)
    labels, count = label_components(mask)
    assert count == 2
    assert labels[0, 0] == labels[1, 1] == 1 and labels[1, 3] == labels[2, 3] == 2


def test_find_islands_rows_partition_the_mask_in_raster_order():
    for mask in random_masks():
        mask = torch.from_numpy(mask)
        width = mask.shape[1]
        islands = find_islands(mask)
        positions = [p for island in islands for row in island for p in row]
        assert sorted(positions) == mask.flatten().nonzero()[:, 0].tolist()
        firsts = [island[0][0] for island in islands]
        assert firsts == sorted(firsts)
        for island in islands:
            rows = [row[0] // width for row in island]
            assert rows == sorted(set(rows))
            for row in island:
                assert row == sorted(row) and len({p // width for p in row}) == 1


def brute_force_expansion(rejected: np.ndarray, l: int, draft: np.ndarray) -> np.ndarray:
    height, width = rejected.shape
    out = np.zeros_like(rejected)
    positions = np.flatnonzero(rejected)
    if len(positions) == 0:
        return out
    first = positions[0]
    for t in positions:
        row_t, col_t = divmod(t, width)
        for u in range(height * width):
            row_u, col_u = divmod(u, width)
            if abs(row_u - row_t) <= l and abs(col_u - col_t) <= l and u >= first and draft.flat[u]:
                out.flat[u] = True
    return out


@pytest.mark.parametrize("l", [0, 1, 2])
def test_expansion_matches_definition_and_never_reaches_before_t0(l):
    generator = np.random.default_rng(l)
    for _ in range(20):
        height, width = 6, 7
        start = int(generator.integers(0, height * width))
        draft = np.arange(height * width).reshape(height, width) >= start
        rejected = (generator.random((height, width)) < 0.08) & draft
        result = expand_rejections(torch.from_numpy(rejected), l, torch.from_numpy(draft)).numpy()
        assert (result == brute_force_expansion(rejected, l, draft)).all()
        if rejected.any():
            t0 = np.flatnonzero(rejected)[0]
            assert np.flatnonzero(result).min() == t0  # nothing before the first rejection
            assert (result >= rejected).all() and not (result & ~draft).any()
        if l == 0:
            assert (result == rejected).all()


def test_expansion_keeps_to_the_draft_and_after_t0():
    # row 1 is the first draft row: the expansion of (2, 2) may not reach row 1 left of t0 = (1, 3)
    draft = torch.zeros(4, 5, dtype=torch.bool)
    draft[1:3] = True
    rejected = torch.zeros(4, 5, dtype=torch.bool)
    rejected[1, 3] = rejected[2, 2] = True
    result = expand_rejections(rejected, 1, draft)
    expected = torch.zeros(4, 5, dtype=torch.bool)
    expected[1, 3:] = True
    expected[2, 1:] = True
    assert torch.equal(result, expected)


def test_expansion_errors():
    mask = torch.zeros(2, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="l must be >= 0"):
        expand_rejections(mask, -1, mask)
    rejected = mask.clone()
    rejected[0, 0] = True
    with pytest.raises(ValueError, match="rejected positions must be draft positions"):
        expand_rejections(rejected, 1, mask)
    with pytest.raises(ValueError, match="masks of one shape"):
        expand_rejections(mask, 1, torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="must be a 2-D"):
        label_components(torch.zeros(2, 2, 2, dtype=torch.bool))
