"""A small CNN for the 8x8 digits and a loader with its own partition: examples of the plug-in targets.

    fl-server simulate --model mlsyskit.tools.fl.examples.digits_cnn:small_cnn \
        --dataset mlsyskit.tools.fl.examples.digits_cnn:digits_two_labels_per_client ...
"""
from __future__ import annotations

import numpy as np
from torch import nn

from mlsyskit.tools.fl.data import _digits


class SmallCNN(nn.Module):
    """conv 3x3 (8) -> ReLU -> max-pool 2 -> conv 3x3 (16) -> ReLU -> linear; input rows are 8x8 images."""

    def __init__(self, num_features: int, num_classes: int) -> None:
        super().__init__()
        side = int(round(num_features ** 0.5))
        if side * side != num_features:
            raise ValueError(f"SmallCNN needs square images, got {num_features} features")
        self.side = side
        self.features = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(8, 16, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(16 * (side // 2) ** 2, num_classes)

    def forward(self, x):
        h = self.features(x.view(-1, 1, self.side, self.side))
        return self.head(h.flatten(1))


def small_cnn(num_features: int, num_classes: int) -> nn.Module:
    return SmallCNN(num_features, num_classes)


def digits_two_labels_per_client(num_clients: int, seed: int):
    """scikit-learn's digits with a pathological partition: client c holds (most of) labels c and c+1 mod 10."""
    x, y = _digits()
    rng = np.random.default_rng(seed)
    client_of = np.empty(len(y), dtype=np.int64)
    for label in range(10):
        owners = [c for c in range(num_clients) if label in (c % 10, (c + 1) % 10)] or list(range(num_clients))
        idx = np.flatnonzero(y == label)
        client_of[idx] = rng.choice(owners, size=len(idx))
    return x, y, client_of
