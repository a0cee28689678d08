"""LPIPS's random-backbone warning appears only where an LPIPS loss is active: as the up-sampler's
validation metric alone, its description (`lpips_metric`) says so instead."""

from __future__ import annotations

import warnings

import pytest
from mulo_sd.training.losses import LPIPS

from tests.training.test_sampler_training import folders, instantiate_module  # noqa: F401 (fixture)

RANDOM = "RANDOM alex backbone"


def random_backbone_warnings(make) -> tuple[object, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        made = make()
    return made, [str(w.message) for w in caught if RANDOM in str(w.message)]


def test_a_metric_only_lpips_does_not_warn_but_says_so():
    metric, caught = random_backbone_warnings(lambda: LPIPS("alex", pretrained_backbone=False, as_loss=False))
    assert caught == [] and "random (NOT perceptual)" in metric.describe()
    _, caught = random_backbone_warnings(lambda: LPIPS("alex", pretrained_backbone=False))
    assert len(caught) == 1


@pytest.mark.parametrize(("loss", "warns"), [("token_ce", False), ("mse_lpips", True)])
def test_the_up_sampler_warns_only_when_lpips_is_a_loss(folders, loss, warns):  # noqa: F811
    module, caught = random_backbone_warnings(lambda: instantiate_module(folders, [f"loss={loss}"]))
    assert bool(caught) == warns
    assert "random (NOT perceptual)" in module.lpips.describe()  # val/lpips: logged as lpips_metric
