"""User code for the CLI error tests: loaders and a model factory that raise, one loader that works."""
from __future__ import annotations

import numpy as np


def raising_loader(num_clients: int, seed: int):
    raise RuntimeError("the dataset server is down")


def raising_client_data():
    return {"x": 1}["y"]  # a KeyError inside the user's loader


def own_arrays():
    rng = np.random.default_rng(0)
    return rng.normal(size=(40, 64)).astype(np.float32), rng.integers(0, 10, 40)


def raising_model(num_features: int, num_classes: int):
    raise TypeError("unsupported layer")
