"""The federated model on the server side: the built-in MLP (Linear-ReLU-Linear) in numpy, or your own.

Weights travel as a name -> numpy array dict with torch's state_dict names, so clients load
them into the torch module (tools/fl/torch_model.py) unchanged. For the MLP the server imports
no torch to initialise, average or evaluate (a few lines of numpy keep start-up fast); a custom
model (`TrainSpec.model = "package.module:factory"`, tools/fl/plugins.py) runs in torch.
Note that TIFF's verifier trains one reference update per round, so a TIFF server does import
torch at its first round.
"""
from __future__ import annotations

import numpy as np

Weights = dict[str, np.ndarray]


def init_weights(num_features: int, num_classes: int, hidden: int, seed: int, model: str = "") -> Weights:
    """torch.nn.Linear's default initialisation: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias.
    With `model` (package.module:factory) the custom module's own initialisation, through torch."""
    if model:
        from mlsyskit.tools.fl.torch_model import initial_weights

        return initial_weights(model, num_features, num_classes, seed)
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


def evaluate(weights: Weights, x: np.ndarray, y: np.ndarray, model: str = "", num_classes: int = 0) -> dict[str, float]:
    """Accuracy and mean cross-entropy of the global model on a labelled set (a custom `model` runs in torch)."""
    if len(y) == 0:
        return {"accuracy": 0.0, "loss": 0.0}
    if model:
        from mlsyskit.tools.fl.torch_model import evaluate_model

        return evaluate_model(model, weights, x, y, num_classes or int(y.max()) + 1)
    z = logits(weights, x).astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    log_probs = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return {"accuracy": float((z.argmax(axis=1) == y).mean()), "loss": float(-log_probs[np.arange(len(y)), y].mean())}


def shapes(weights: Weights) -> dict[str, tuple[int, ...]]:
    return {name: tuple(a.shape) for name, a in weights.items()}


def shape_mismatch(ours: Weights, theirs: object) -> str | None:
    """Why a client's {name: shape} does not match the server's model (None when it does)."""
    if not isinstance(theirs, dict):
        return "the client sent no model shapes"
    mine = {name: list(shape) for name, shape in shapes(ours).items()}
    given = {str(name): list(shape) if isinstance(shape, list | tuple) else shape for name, shape in theirs.items()}
    if mine == given:
        return None
    differ = sorted(set(mine) ^ set(given)) or sorted(n for n in mine if mine[n] != given[n])
    return f"the client's model differs from the server's at {', '.join(differ[:5])}" + \
        (f" (server {mine.get(differ[0])}, client {given.get(differ[0])})" if differ else "")


def flatten(weights: Weights) -> np.ndarray:
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in weights.values()])
