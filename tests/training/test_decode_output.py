"""`mulo-decode` prints only the statistics a method has: no blank `accepted_per_cycle_mean` or
`islands_per_cycle` for methods without draft cycles."""

from __future__ import annotations

import pytest
from mulo_sd.training.decode import format_stats, run

from tests.training.test_decode_cli import at, compose, testbed  # noqa: F401 (the fixture)


def names(printed: str) -> list[str]:
    return [line.split()[0] for line in printed.splitlines()]


@pytest.mark.parametrize("method", ["ar", "zipar"])
def test_statistics_a_method_does_not_have_are_not_printed(testbed, tmp_path, method):  # noqa: F811
    row = run(compose("decode", tmp_path, [f"method={method}", *at(testbed), f"out={tmp_path / 'a.png'}"]))
    assert row["accepted_per_cycle_mean"] == "" and row["islands_per_cycle"] == ""  # the CSV row keeps them
    printed = names(format_stats(row))
    assert "accepted_per_cycle_mean" not in printed and "islands_per_cycle" not in printed
    assert printed == [name for name, value in row.items() if value != ""]  # the rest, zeros included


def test_a_tree_method_prints_its_accepted_length(testbed, tmp_path):  # noqa: F811
    row = run(compose("decode", tmp_path, ["method=eagle2", *at(testbed), f"out={tmp_path / 'a.png'}"]))
    assert isinstance(row["accepted_per_cycle_mean"], float)
    assert "accepted_per_cycle_mean" in names(format_stats(row))
