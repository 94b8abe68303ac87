"""Local-only baselines trained side by side in numpy (tools/fl/baseline.py) are the torch loop's, step for step."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mlsyskit.tools.fl.baseline import local_only_accuracies, local_only_models
from mlsyskit.tools.fl.config import TrainSpec
from mlsyskit.tools.fl.model import init_weights
from mlsyskit.tools.fl.task import ClientData
from mlsyskit.tools.fl.torch_model import build_model, get_weights, set_weights
from mlsyskit.tools.fl.training import _train, local_only_accuracy

FEATURES, CLASSES = 12, 4
SPEC = TrainSpec(batch_size=8, hidden=16, local_only_epochs=3)


def _client(cid: int, n: int) -> ClientData:
    rng = np.random.default_rng(cid)
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + 2 * (x[:, 1] > 0).astype(np.int64)
    return ClientData(cid, x, y, x[: n // 2], y[: n // 2])


CLIENTS = [_client(0, 5), _client(1, 37), _client(2, 16), _client(3, 23)]  # partial, several and exact batches
SEEDS = [11, 12, 13, 14]


def _torch_baseline(client: ClientData, seed: int) -> dict[str, np.ndarray]:
    model = build_model(FEATURES, CLASSES, SPEC.hidden)
    set_weights(model, init_weights(FEATURES, CLASSES, SPEC.hidden, seed))
    _train(model, torch.from_numpy(client.x_train), torch.from_numpy(client.y_train), SPEC, SPEC.local_only_epochs,
           torch.Generator().manual_seed(seed), exact_first_epoch=False)
    return get_weights(model)


def test_numpy_baselines_follow_the_torch_loop() -> None:  # (training.py no longer imports torch._dynamo)
    ours = local_only_models(CLIENTS, SEEDS, SPEC, FEATURES, CLASSES)
    for client, seed, weights in zip(CLIENTS, SEEDS, ours, strict=True):
        reference = _torch_baseline(client, seed)
        start = init_weights(FEATURES, CLASSES, SPEC.hidden, seed)
        assert not np.allclose(reference["0.weight"], start["0.weight"])  # it trained
        for name, array in reference.items():
            np.testing.assert_allclose(weights[name], array, atol=2e-5, err_msg=f"client {client.client_id} {name}")


def test_a_baseline_does_not_depend_on_the_clients_trained_with_it() -> None:
    together = local_only_models(CLIENTS, SEEDS, SPEC, FEATURES, CLASSES)
    for i, (client, seed) in enumerate(zip(CLIENTS, SEEDS, strict=True)):
        alone = local_only_models([client], [seed], SPEC, FEATURES, CLASSES)[0]
        for name in alone:
            assert np.array_equal(alone[name], together[i][name])
    accuracies = local_only_accuracies(CLIENTS[::-1], SEEDS[::-1], SPEC, FEATURES, CLASSES)
    assert accuracies == [local_only_accuracy(c, SPEC, FEATURES, CLASSES, s) for c, s in zip(CLIENTS[::-1], SEEDS[::-1], strict=True)]
    assert all(0.0 <= a <= 1.0 for a in accuracies) and max(accuracies) > 0.25


def test_custom_models_are_refused_here() -> None:
    with pytest.raises(ValueError, match="built-in MLP"):
        local_only_models(CLIENTS, SEEDS, TrainSpec(model="pkg.mod:factory"), FEATURES, CLASSES)
    assert local_only_models([], [], SPEC, FEATURES, CLASSES) == []
