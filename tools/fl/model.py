"""The federated model, a small MLP (Linear-ReLU-Linear), on the server side: numpy only.

Weights travel as a name -> numpy array dict with torch's state_dict names, so clients load
them into the torch module (tools/fl/torch_model.py) unchanged. The server never imports
torch: initialising, averaging and evaluating an MLP is a few lines of numpy, and it keeps
`fl-server` start-up fast.
"""
from __future__ import annotations

import numpy as np

Weights = dict[str, np.ndarray]


def init_weights(num_features: int, num_classes: int, hidden: int, seed: int) -> Weights:
    """torch.nn.Linear's default initialisation: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias."""
    rng = np.random.default_rng(seed)

    def layer(fan_in: int, fan_out: int) -> tuple[np.ndarray, np.ndarray]:
        bound = 1.0 / np.sqrt(fan_in)
        return (rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32),
                rng.uniform(-bound, bound, fan_out).astype(np.float32))

    w0, b0 = layer(num_features, hidden)
    w2, b2 = layer(hidden, num_classes)
    return {"0.weight": w0, "0.bias": b0, "2.weight": w2, "2.bias": b2}


def logits(weights: Weights, x: np.ndarray) -> np.ndarray:
    h = np.maximum(x @ weights["0.weight"].T + weights["0.bias"], 0.0)
    return h @ weights["2.weight"].T + weights["2.bias"]


def evaluate(weights: Weights, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Accuracy and mean cross-entropy of the global model on a labelled set."""
    if len(y) == 0:
        return {"accuracy": 0.0, "loss": 0.0}
    z = logits(weights, x).astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    log_probs = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return {"accuracy": float((z.argmax(axis=1) == y).mean()), "loss": float(-log_probs[np.arange(len(y)), y].mean())}


def shapes(weights: Weights) -> dict[str, tuple[int, ...]]:
    return {name: tuple(a.shape) for name, a in weights.items()}


def flatten(weights: Weights) -> np.ndarray:
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in weights.values()])
