"""fl-client's warm-up before its first task (training.warm_up): it pays torch's first-use costs outside the
timed window, so a scheduler's first latency reading is the device's, and it changes no training result."""
from __future__ import annotations

import numpy as np

from mlsyskit.tools.fl.config import TrainSpec
from mlsyskit.tools.fl.model import init_weights
from mlsyskit.tools.fl.task import ClientData
from mlsyskit.tools.fl.training import train_local, warm_up


def _client() -> ClientData:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(40, 7)).astype(np.float32)
    y = rng.integers(0, 3, 40).astype(np.int64)
    return ClientData(0, x[:30], y[:30], x[30:], y[30:])


def test_warm_up_leaves_training_unchanged():
    spec = TrainSpec(epochs=2, batch_size=8, lr=0.05, hidden=5)
    data, weights = _client(), init_weights(7, 3, 5, seed=1)
    before = train_local(weights, data, spec, 7, 3, seed=11)
    warm_up(7, 3, spec)  # the same cached module shape: it must not carry the warm-up's weights or state over
    after = train_local(weights, data, spec, 7, 3, seed=11)
    assert before.weights.keys() == after.weights.keys()
    for name in before.weights:
        np.testing.assert_array_equal(before.weights[name], after.weights[name])
    assert (before.loss, before.quality, before.consumer_accuracy) == (after.loss, after.quality, after.consumer_accuracy)
