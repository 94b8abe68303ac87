"""The clients' model (a small MLP) and its weights as a name -> numpy array dict (the wire format)."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

Weights = dict[str, np.ndarray]


def build_model(num_features: int, num_classes: int, hidden: int, seed: int) -> nn.Module:
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)  # the initial global model is a function of the job seed
    try:
        return nn.Sequential(nn.Linear(num_features, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))
    finally:
        torch.random.set_rng_state(generator_state)


def get_weights(model: nn.Module) -> Weights:
    return {name: t.detach().cpu().numpy().copy() for name, t in model.state_dict().items()}


def set_weights(model: nn.Module, weights: Weights) -> None:
    model.load_state_dict({name: torch.from_numpy(np.asarray(a)) for name, a in weights.items()})


def shapes(weights: Weights) -> dict[str, tuple[int, ...]]:
    return {name: tuple(a.shape) for name, a in weights.items()}


def flatten(weights: Weights) -> np.ndarray:
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in weights.values()])


@torch.no_grad()
def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    if len(y) == 0:
        return 0.0
    predictions = model(torch.from_numpy(x)).argmax(dim=1).numpy()
    return float((predictions == y).mean())


def evaluate(weights: Weights, x: np.ndarray, y: np.ndarray, num_features: int, num_classes: int,
             hidden: int) -> dict[str, float]:
    model = build_model(num_features, num_classes, hidden, seed=0)
    set_weights(model, weights)
    with torch.no_grad():
        logits = model(torch.from_numpy(x))
        loss = float(nn.functional.cross_entropy(logits, torch.from_numpy(y)))
    return {"accuracy": float((logits.argmax(dim=1).numpy() == y).mean()), "loss": loss}
