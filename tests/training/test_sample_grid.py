"""Sample grids name their rows in the image, wrapped between words only (training/sample_grid.py)."""

from __future__ import annotations

import torch
from mulo_sd.training.sample_grid import LABEL_WIDTH, label_layout, labelled_grid, wrap_words
from PIL import ImageFont

FONT = ImageFont.load_default()


def test_labels_wrap_between_words_only():
    label = "up-sampled tokens (decoded), accept_rule=absolute_with_a_long_setting"
    for width in (10, 40, 80, 200):
        lines = wrap_words(label, FONT, width)
        assert " ".join(lines).split() == label.split()  # every word whole, in order
        assert all(FONT.getlength(line) <= width or " " not in line for line in lines)


def test_a_word_wider_than_the_column_widens_it():
    word = "accept_rule=absolute_with_a_very_long_setting_name"
    width, lines = label_layout(["AR", word], row_height=64, font=FONT)
    assert width > LABEL_WIDTH and width >= FONT.getlength(word) and lines == [["AR"], [word]]


def test_a_short_row_gets_a_wider_column_instead_of_overflowing():
    label = "input tokens (decoded) of the low-resolution grid"
    tall, _ = label_layout([label], row_height=128, font=FONT)
    short, lines = label_layout([label], row_height=12, font=FONT)
    assert short > tall and len(lines[0]) == 1


def test_the_grid_is_the_images_with_a_label_column_on_the_left():
    rows = [torch.zeros(3, 3, 32, 32), torch.ones(3, 3, 32, 32)]
    grid = labelled_grid(rows, ["black", "white"])
    width, _ = label_layout(["black", "white"], 32, FONT)
    assert grid.shape == (3, 2 + 2 * 34, width + 2 + 3 * 34)
    assert torch.equal(grid[:, 2:34, width + 2 : width + 34], torch.zeros(3, 32, 32))
    assert torch.equal(grid[:, 36:68, width + 2 : width + 34], torch.ones(3, 32, 32))
    for top in (2, 36):  # each row's label is drawn within its band
        assert (grid[0, top : top + 32, :width] < 0.5).sum() > 10
