"""mulo_sd.training.frozen: helper models stay frozen, in eval mode and out of checkpoints, also across
pickling (DDP spawn) and deep copies (EMA)."""

import copy
import pickle

import torch
import torch.nn as nn
from mulo_sd.training.frozen import frozen


def parent_with_frozen_child() -> nn.Module:
    parent = nn.Module()
    parent.head = nn.Linear(2, 2)
    parent.helper = frozen(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5)))
    return parent


def test_frozen_child_stays_in_eval_without_grads_and_out_of_the_state_dict():
    for parent in (
        parent_with_frozen_child(),
        pickle.loads(pickle.dumps(parent_with_frozen_child())),
        copy.deepcopy(parent_with_frozen_child()),
    ):
        parent.train()
        assert parent.head.training and not any(m.training for m in parent.helper.modules())
        assert not any(p.requires_grad for p in parent.helper.parameters())
        assert list(parent.state_dict()) == ["head.weight", "head.bias"]
        weight = parent.helper[0].weight.clone()
        parent.load_state_dict({"head.weight": torch.zeros(2, 2), "head.bias": torch.zeros(2)})  # strict
        assert torch.equal(parent.helper[0].weight, weight) and parent.head.weight.abs().sum() == 0
        x = torch.ones(4, 2)
        assert torch.equal(parent.helper(x), parent.helper(x))  # dropout is off
