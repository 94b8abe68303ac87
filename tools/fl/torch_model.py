"""The same MLP as a torch module, for the clients that train it."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from mlsyskit.tools.fl.model import Weights


def build_model(num_features: int, num_classes: int, hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(num_features, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))


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
