"""torch_model.Sgd, which fl trains with, is torch.optim.SGD bit for bit: the same weights after many steps,
accumulated and minibatch steps mixed, with and without momentum, for the built-in MLP and a CNN, and a
parameter without a gradient left as it is. (Sgd exists because a torch.optim optimiser imports
torch._dynamo: ~3 CPU s in every process that trains.)"""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from mlsyskit.tools.fl.examples.digits_cnn import small_cnn
from mlsyskit.tools.fl.torch_model import Sgd, build_model


def _trained(model: nn.Module, optimiser, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    for epoch in range(3):
        order = torch.randperm(len(y), generator=generator)
        optimiser.zero_grad()
        for start in range(0, len(y), 8):
            batch = order[start:start + 8]
            loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
            if epoch == 0:  # accumulated, one step at the end (training.py's exact first epoch)
                (loss * (len(batch) / len(y))).backward()
            else:
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
        if epoch == 0:
            optimiser.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.slow  # no process, but torch.optim's first use imports torch._dynamo: ~3 CPU s
@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_sgd_equals_torch_optim_sgd_bit_for_bit(kind, momentum):
    torch.manual_seed(3)
    model = build_model(64, 10, 16) if kind == "mlp" else small_cnn(64, 10)
    next(model.parameters()).requires_grad_(False)  # no gradient: both optimisers must leave it alone
    twin = copy.deepcopy(model)
    start = [p.detach().clone() for p in model.parameters()]
    generator = torch.Generator().manual_seed(5)
    x, y = torch.rand(40, 64, generator=generator), torch.randint(0, 10, (40,), generator=generator)
    ours = _trained(model, Sgd(model.parameters(), lr=0.05, momentum=momentum), x, y)
    theirs = _trained(twin, torch.optim.SGD(twin.parameters(), lr=0.05, momentum=momentum), x, y)
    assert len(ours) == len(theirs) >= 4
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    assert torch.equal(ours[0], start[0])  # the parameter without a gradient
    assert not any(torch.equal(a, b) for a, b in zip(ours[1:], start[1:], strict=True))  # every other one trained
