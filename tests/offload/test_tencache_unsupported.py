"""What tencache cannot run, or must not continue with, fails with a clear error naming the cause."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mlsyskit.core.errors import RuntimeFailure, UsageError
from mlsyskit.tools.offload import Budgets, offload, profile
from mlsyskit.tools.offload.optimizer import NonFiniteError


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.b(torch.relu(self.a(x))).float(), torch.arange(x.shape[0]) % 4)


def data(step: int = 0) -> torch.Tensor:
    return torch.randn(6, 16, generator=torch.Generator().manual_seed(step)).to(torch.bfloat16)


CPU = torch.device("cpu")  # the emulated device, also on a GPU machine
BUDGETS = Budgets(device=1 << 20, cpu=1 << 20, optimizer=1 << 20)


def test_optimizer_other_than_adamw_is_refused():
    model = Net()
    with pytest.raises(UsageError, match="optimizer SGD is not supported"), \
            offload(model, torch.optim.SGD(model.parameters(), lr=0.1), BUDGETS, policy="lru", device=CPU):
        pass


@pytest.mark.parametrize("kwargs, match", [({"amsgrad": True}, "amsgrad=True is not supported"),
                                           ({"maximize": True}, "maximize=True is not supported")])
def test_adamw_options_not_implemented_are_refused(kwargs, match):
    model = Net()
    with pytest.raises(UsageError, match=match), \
            offload(model, torch.optim.AdamW(model.parameters(), **kwargs), BUDGETS, policy="lru", device=CPU):
        pass


def test_adam_with_l2_weight_decay_is_refused():
    model = Net()
    with pytest.raises(UsageError, match="use torch.optim.AdamW"), \
            offload(model, torch.optim.Adam(model.parameters(), weight_decay=0.1), BUDGETS, policy="lru", device=CPU):
        pass


def test_backward_beyond_accumulate_raises():
    model = Net()
    with offload(model, torch.optim.AdamW(model.parameters()), BUDGETS, policy="lru", device=CPU, accumulate=2) as engine:
        engine.begin_step()
        engine.backward(model(data(0)))
        engine.backward(model(data(1)))
        with pytest.raises(UsageError, match="backward pass 3 in a step with accumulate=2"):
            engine.backward(model(data(2)))


def test_step_with_too_few_backward_passes_raises():
    model = Net()
    with offload(model, torch.optim.AdamW(model.parameters()), BUDGETS, policy="lru", device=CPU, accumulate=4) as engine:
        engine.begin_step()
        engine.backward(model(data(0)))
        with pytest.raises(UsageError, match="after 1 of 4 backward passes"):
            engine.begin_step()


def test_non_finite_lr_from_a_scheduler_stops_training():
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with offload(model, opt, BUDGETS, policy="lru", device=CPU) as engine:
        engine.begin_step()
        engine.backward(model(data()))
        opt.param_groups[0]["lr"] = float("inf")
        with pytest.raises(NonFiniteError, match="param group 0: non-finite optimizer setting"):
            engine.begin_step()
    assert issubclass(NonFiniteError, RuntimeFailure)  # exit code 1 from a CLI


def test_non_finite_loss_stops_before_backward():
    model = Net()
    with offload(model, torch.optim.AdamW(model.parameters()), BUDGETS, policy="lru", device=CPU) as engine:
        engine.begin_step()
        with pytest.raises(NonFiniteError, match="the loss is nan at step 1"):
            engine.backward(model(data()) * float("nan"))


def test_non_finite_gradient_names_the_parameter():
    class Poisoned(Net):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            # sqrt(|0 * bias|) is 0, but its derivative at 0 is inf: the loss is finite, b.bias's gradient NaN
            return super().forward(x) + torch.sqrt((self.b.bias.float() * 0).abs()).sum()

    model = Poisoned()
    with offload(model, torch.optim.AdamW(model.parameters()), BUDGETS, policy="lru", device=CPU) as engine:
        engine.begin_step()
        loss = model(data())
        assert torch.isfinite(loss)
        with pytest.raises(NonFiniteError, match="the gradient of b.bias at step 1 is not finite"):
            engine.backward(loss)


def test_profile_refuses_unreached_trainable_parameter():
    class Unused(Net):
        def __init__(self) -> None:
            super().__init__()
            self.spare = nn.Linear(3, 3)

    with pytest.raises(ValueError, match="no gradient reached 2 trainable parameters .e.g. spare.weight"):
        profile(Unused(), lambda m: m(data()))
