import numpy as np
import pytest
import scipy.ndimage
import torch

from mulo_sd.islands import expand_rejections, find_islands, label_components


def random_masks():
    generator = np.random.default_rng(0)
    shapes = [(1, 1), (1, 9), (9, 1), (5, 7), (8, 8), (16, 12)]
    for shape in shapes:
        for density in (0.0, 0.2, 0.45, 0.7, 1.0):
            yield generator.random(shape) < density


def same_up_to_permutation(labels: np.ndarray, reference: np.ndarray) -> bool:
    """True when the two labellings induce the same partition of the mask."""
    pairs = set(zip(labels.flatten().tolist(), reference.flatten().tolist(), strict=True))
    forward = {a for a, _ in pairs}
    backward = {b for _, b in pairs}
    return len(pairs) == len(forward) == len(backward)


def test_labels_match_scipy_8_connectivity():
    checked = 0
    for mask in random_masks():
        labels, count = label_components(torch.from_numpy(mask))
        reference, reference_count = scipy.ndimage.label(mask, structure=np.ones((3, 3)))
        assert count == reference_count
        assert ((labels.numpy() == 0) == ~mask).all()
        assert same_up_to_permutation(labels.numpy(), reference)
        checked += count > 1
    assert checked >= 5  # several masks with more than one component


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
