"""Safe to misuse: a failed offload() leaves the model exactly as it was (bit for bit, every failure path)
and a retry with larger budgets trains; the usual torch loop inside offload() raises a clear error;
optimizer=None, tensor and unrepresentable lrs, and parameters missing from the optimizer are refused."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from mlsyskit.core.errors import UsageError
from mlsyskit.tools.offload import Budgets, offload, profile
from mlsyskit.tools.offload import engine as engine_mod
from mlsyskit.tools.offload.api import lr_problem
from mlsyskit.tools.offload.pools import BudgetError
from mlsyskit.tools.offload.profiler import ProfileError
from mlsyskit.tools.offload.reference import plain

CPU = torch.device("cpu")


class Net(nn.Module):
    """fp32 parameters, a frozen one, BatchNorm buffers: every kind of state offload() converts."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(32, 16)
        self.up, self.down = nn.Linear(16, 64), nn.Linear(64, 16)
        self.bn = nn.BatchNorm1d(16)
        self.frozen = nn.Linear(16, 16)
        self.frozen.requires_grad_(False)
        self.head = nn.Linear(16, 32)

    def forward(self, x, y):
        h = self.emb(x)
        h = h + self.down(torch.relu(self.up(h)))
        h = self.bn(h.transpose(1, 2)).transpose(1, 2) + self.frozen(h)
        return nn.functional.cross_entropy(self.head(h).float().reshape(-1, 32), y.reshape(-1))


def data(step):
    g = torch.Generator().manual_seed(step)
    x = torch.randint(0, 32, (4, 8), generator=g)
    return x, (x * 5 + 1) % 32


def state(model):
    """Every tensor the model holds, with its identity, dtype and exact values."""
    out = {}
    for n, p in model.named_parameters():
        out[n] = (id(p), p.dtype, p.requires_grad, p.detach().clone())
    for n, b in model.named_buffers():
        out["buf:" + n] = (None, b.dtype, False, b.clone())
    return out


def assert_same(before, model):
    after = state(model)
    assert after.keys() == before.keys()
    for k, (ident, dtype, rg, value) in before.items():
        ident2, dtype2, rg2, value2 = after[k]
        assert (ident, dtype, rg) == (ident2, dtype2, rg2), k
        assert torch.equal(value.view(torch.uint8) if value.is_floating_point() else value,
                           value2.view(torch.uint8) if value2.is_floating_point() else value2), k


def fresh():
    torch.manual_seed(0)
    model = Net()
    return model, torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.0)


ROOMY = dict(device=64 << 10, cpu=64 << 10, optimizer=1 << 20)


def run(model, opt, budgets, prof, steps=3):
    losses = []
    with offload(model, opt, budgets, prof, device=CPU) as engine:
        for step in range(steps):
            engine.begin_step()
            loss = model(*data(step))
            engine.backward(loss)
            losses.append(loss.item())
    return losses


def reference(steps=3):
    model, opt = fresh()
    losses = []
    with plain(model, opt) as ref:
        for step in range(steps):
            ref.begin_step()
            loss = model(*data(step))
            ref.backward(loss)
            losses.append(loss.item())
    return losses


class Boom(RuntimeError):
    pass


def _raise(*_a, **_k):
    raise Boom("injected")


@pytest.mark.parametrize("case", ["optimizer-budget", "device-budget", "no-nvme", "profile", "nvme-dir",
                                  "late-failure", "accumulate", "policy"])
def test_a_failed_offload_leaves_the_model_bit_for_bit_and_a_retry_trains(case, tmp_path, monkeypatch):
    model, opt = fresh()
    prof = profile(model, lambda m: m(*data(0)), name="net")
    before = state(model)
    kwargs: dict = {}
    budgets = Budgets(**ROOMY, nvme_dir=tmp_path)
    expected: type[BaseException] = BudgetError
    if case == "optimizer-budget":
        budgets = Budgets(device=64 << 10, cpu=64 << 10, optimizer=1 << 10)  # no NVMe for the overflow
    elif case == "device-budget":
        budgets = Budgets(device=1 << 10, cpu=64 << 10, optimizer=1 << 20, nvme_dir=tmp_path)
    elif case == "no-nvme":
        budgets = Budgets(device=4 << 10, cpu=4 << 10, optimizer=1 << 20)
    elif case == "profile":
        other = nn.Linear(3, 3)
        prof = profile(other, lambda m: m(torch.ones(1, 3, dtype=torch.bfloat16)).float().sum(), name="other")
        expected = ProfileError
    elif case == "nvme-dir":
        budgets = Budgets(**ROOMY, nvme_dir=tmp_path / "missing")
        expected = Exception
    elif case == "late-failure":  # after the tiers are populated and the hooks installed
        monkeypatch.setattr(engine_mod, "OptimizerWorker", _raise)
        expected = Boom
    elif case == "accumulate":
        kwargs = {"accumulate": 0}
        expected = UsageError
    elif case == "policy":
        kwargs = {"policy": "no-such-policy"}
        expected = Exception
    with pytest.raises(expected), offload(model, opt, budgets, prof, device=CPU, **kwargs):
        pytest.fail("entered")
    assert_same(before, model)
    assert not any(m._forward_hooks or m._forward_pre_hooks or m._backward_pre_hooks for m in model.modules())
    assert not any(p._post_accumulate_grad_hooks for p in model.parameters())
    monkeypatch.undo()
    if case == "profile":
        prof = profile(model, lambda m: m(*data(0)), name="net")
    assert run(model, opt, Budgets(**ROOMY, nvme_dir=tmp_path), prof) == reference()


def test_loss_backward_without_the_engine_raises_a_clear_error(tmp_path):
    model, opt = fresh()
    prof = profile(model, lambda m: m(*data(0)), name="net")
    with offload(model, opt, Budgets(**ROOMY, nvme_dir=tmp_path), prof, device=CPU) as engine:
        engine.begin_step()
        loss = model(*data(0))
        with pytest.raises(UsageError, match=r"engine\.backward\(loss\) instead of loss\.backward\(\)"):
            loss.backward()


def test_the_users_own_optimizer_step_raises_and_the_engines_steps_still_run(tmp_path):
    model, opt = fresh()
    prof = profile(model, lambda m: m(*data(0)), name="net")
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=1.0)
    losses = []
    with offload(model, opt, Budgets(**ROOMY, nvme_dir=tmp_path), prof, device=CPU) as engine:
        for step in range(3):
            engine.begin_step()
            loss = model(*data(step))
            engine.backward(loss)  # calls opt.step() itself (hooks, schedulers): allowed
            sched.step()
            losses.append(loss.item())
            with pytest.raises(UsageError, match=r"do not call optimizer\.step\(\)"):
                opt.step()
    assert losses == reference()
    opt.step()  # after the block the optimizer is the user's again


def test_optimizer_none_tensor_lr_and_missing_parameters_are_refused_by_name(tmp_path):
    model, opt = fresh()
    before = state(model)
    budgets = Budgets(**ROOMY, nvme_dir=tmp_path)
    with pytest.raises(UsageError, match="needs the torch optimizer"), offload(model, None, budgets, device=CPU):
        pass
    tensor_lr = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=torch.tensor(1e-2))
    with pytest.raises(UsageError, match="tensor lr"), offload(model, tensor_lr, budgets, device=CPU):
        pass
    partial = torch.optim.AdamW([model.up.weight, model.emb.weight], lr=1e-2)
    with pytest.raises(UsageError) as info, offload(model, partial, budgets, device=CPU):
        pass
    missing = [n for n, p in model.named_parameters() if p.requires_grad and n not in ("up.weight", "emb.weight")]
    assert f"{len(missing)} trainable parameters" in str(info.value)
    assert all(n in str(info.value) for n in missing) and "frozen" not in str(info.value)
    assert_same(before, model)


@pytest.mark.parametrize("lr", [float("inf"), float("nan"), -1.0, 1e38, 1e-46])
def test_unrepresentable_lrs_are_refused(lr):
    assert lr_problem(lr) is not None
    assert lr_problem(1e-3) is None and lr_problem(1e30) is None
    assert lr_problem(0.0) is None  # a param group that must not change
