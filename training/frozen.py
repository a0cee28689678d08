"""Frozen helper models inside a LightningModule (the VQ, the target, LPIPS): they load from their own
folders, so they stay out of checkpoints, never train, and move with the module's device."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn as nn


def frozen(module: nn.Module) -> nn.Module:
    """Freeze `module` in place and return it: no gradients; eval mode that a parent's `.train()` keeps;
    its entries dropped from state_dict, and filled in from the current weights when a state dict is loaded
    (checkpoints saved without them load strictly)."""
    module.requires_grad_(False).eval()
    module.train = partial(_stay_in_eval, module)  # per instance: the parent's train() calls this one
    module.register_state_dict_post_hook(_drop_weights)
    module.register_load_state_dict_pre_hook(_supply_weights)
    return module


def _stay_in_eval(module: nn.Module, mode: bool = True) -> nn.Module:
    return nn.Module.train(module, False)


def _own_weights(module: nn.Module) -> dict[str, torch.Tensor]:
    # remove_duplicate=False: a module may register one tensor twice (lpips: lin0.. and lins.0..)
    return {
        **dict(module.named_parameters(remove_duplicate=False)),
        **dict(module.named_buffers(remove_duplicate=False)),
    }


def _drop_weights(module: nn.Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    for name in _own_weights(module):
        state_dict.pop(prefix + name, None)


def _supply_weights(module: nn.Module, state_dict: dict, prefix: str, *args) -> None:
    for name, tensor in _own_weights(module).items():
        state_dict.setdefault(prefix + name, tensor)
