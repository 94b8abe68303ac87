"""The same MLP as a torch module, for the clients that train it."""
from __future__ import annotations

import threading

import numpy as np
import torch
from torch import nn

from mlsyskit.tools.fl.plugins import PluginError, call_user, load_object
from mlsyskit.tools.fl.threads import torch_imported

torch_imported(torch)  # a single_threaded() made before torch was imported applies to it now

Weights = dict[str, np.ndarray]  # as model.Weights (model.py imports this module for custom models)


def build_model(num_features: int, num_classes: int, hidden: int, model: str = "") -> nn.Module:
    """The built-in MLP, or what the `package.module:factory` named by `model` builds."""
    if not model:
        return nn.Sequential(nn.Linear(num_features, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))
    built = call_user(load_object(model, "--model"), f"--model {model!r}", num_features, num_classes)
    if not isinstance(built, nn.Module):
        raise PluginError(f"--model {model!r} returned a {type(built).__name__}, not a torch nn.Module")
    return built


def initial_weights(model: str, num_features: int, num_classes: int, seed: int) -> Weights:
    """A custom model's starting weights, the same for a given seed (torch's own initialisers)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed % 2**63)
        weights = get_weights(build_model(num_features, num_classes, 0, model))
    bad = [name for name, a in weights.items() if not np.issubdtype(a.dtype, np.floating)]
    if bad:  # FedAvg averages every entry; integer buffers (BatchNorm's counters) cannot be averaged
        raise PluginError(f"--model {model!r} has non-float state {bad}; use layers without integer buffers")
    return weights


_modules: dict[tuple[str, int, int], nn.Module] = {}  # one module per custom model and task, reloaded per call
_mlps = threading.local()  # the built-in MLP per shape, per thread, for training (reloaded per call)


def loaded_model(num_features: int, num_classes: int, hidden: int, model: str, weights: Weights) -> nn.Module:
    """A module of the job's model holding `weights`. The built-in MLP is built once per shape and reloaded
    (its whole state is its weights; building it again cost ~0.3 ms a round, half of what train_local
    spends outside its epochs); a custom model is built afresh, as it may keep state outside them."""
    if model:
        module = build_model(num_features, num_classes, hidden, model)
    else:
        cache = _mlps.__dict__.setdefault("modules", {})
        key = (num_features, num_classes, hidden)
        if key not in cache:
            cache[key] = build_model(num_features, num_classes, hidden)
        module = cache[key]
    set_weights(module, weights)
    return module


@torch.no_grad()
def evaluate_model(model: str, weights: Weights, x: np.ndarray, y: np.ndarray, num_classes: int) -> dict[str, float]:
    """Accuracy and mean cross-entropy of a custom model (the MLP has a numpy version in model.py)."""
    if len(y) == 0:
        return {"accuracy": 0.0, "loss": 0.0}
    key = (model, x.shape[1], num_classes)
    if key not in _modules:
        _modules[key] = build_model(x.shape[1], num_classes, 0, model)
    module = _modules[key]
    set_weights(module, weights)
    module.eval()
    out = module(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))).double()
    loss = nn.functional.cross_entropy(out, torch.from_numpy(y.astype(np.int64)))
    return {"accuracy": float((out.argmax(dim=1).numpy() == y).mean()), "loss": float(loss)}


def get_weights(model: nn.Module) -> Weights:
    return {name: t.detach().cpu().numpy().copy() for name, t in model.state_dict().items()}


def set_weights(model: nn.Module, weights: Weights) -> None:
    model.load_state_dict({name: torch.from_numpy(np.asarray(a)) for name, a in weights.items()})


@torch.no_grad()
def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    if len(y) == 0:
        return 0.0
    predictions = model(torch.from_numpy(x)).argmax(dim=1).numpy()
    return float((predictions == y).mean())


class Sgd:
    """torch.optim.SGD(params, lr, momentum) with the same arithmetic, op for op (its single-tensor path,
    which CPU tensors take; no dampening, weight decay or Nesterov). Creating or stepping a torch.optim
    optimiser imports torch._dynamo, ~3 CPU s (as much again as `import torch`), which every fl-client
    paid at its first round; tests/fl/test_sgd.py checks this one bit for bit against torch's."""

    def __init__(self, params, lr: float, momentum: float = 0.0) -> None:
        self.params = list(params)
        self.lr, self.momentum = lr, momentum
        self.buffers: list[torch.Tensor | None] = [None] * len(self.params)

    def zero_grad(self) -> None:
        for param in self.params:
            param.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for i, param in enumerate(self.params):
            grad = param.grad
            if grad is None:
                continue
            if self.momentum != 0:
                buf = self.buffers[i]
                if buf is None:
                    buf = self.buffers[i] = grad.detach().clone()
                else:
                    buf.mul_(self.momentum).add_(grad, alpha=1)
                grad = buf
            param.add_(grad, alpha=-self.lr)
