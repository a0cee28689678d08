"""Every experiment file composes with `mulo-train`'s config, so an experiment that includes another (the
32x32-token ones include their 16x16 recipe) finds it, and the testbed's names in it point at the testbed."""

from __future__ import annotations

import pytest

from tests.helpers import CONFIG_DIR, compose_train_config

EXPERIMENTS = sorted(
    str(path.relative_to(CONFIG_DIR / "experiment").with_suffix(""))
    for path in (CONFIG_DIR / "experiment").rglob("*.yaml")
)


def test_the_experiment_folder_holds_the_testbed_recipes():
    assert {"testbed/target", "testbed/drafter_small_256", "testbed/eagle_head_256"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes(tmp_path, experiment):
    cfg = compose_train_config(tmp_path, [f"experiment={experiment}"])
    assert cfg.model._target_.startswith("mulo_sd.training.")
    assert cfg.task_name  # each experiment names its runs
