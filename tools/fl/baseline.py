"""Consumers' local-only baselines for the built-in MLP, many clients at once (TIFF's utility ratio).

A consumer's local-only baseline is the accuracy, on its own test split, of the MLP trained on its
own training data alone: `local_only_epochs` epochs of minibatch SGD with momentum (TrainSpec's lr,
momentum and batch size), from init_weights(seed), each epoch in the order torch.randperm draws from
a generator seeded with `seed` (what the torch loop in training.py did, step for step). Here it runs
in numpy, all clients side by side: each optimiser step is one stacked matmul over every client that
still has a batch in this epoch (clients sorted by their number of batches, so those are a prefix),
instead of a dozen torch calls per client and step; 300 baselines take about 1 s instead of about
70 s. The stacked matmul multiplies each client's matrices on their own (one BLAS call per client,
the same shapes whatever the other clients are), so a client's baseline does not depend on which
clients it is trained with: one client alone gives the same number (tests/fl/test_baseline.py).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from mlsyskit.tools.fl.config import TrainSpec
from mlsyskit.tools.fl.model import Weights, init_weights, logits
from mlsyskit.tools.fl.task import ClientData


def _orders(n: int, epochs: int, seed: int) -> list[np.ndarray]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randperm(n, generator=generator).numpy() for _ in range(epochs)]


def local_only_accuracies(clients: Sequence[ClientData], seeds: Sequence[int], spec: TrainSpec, num_features: int,
                          num_classes: int) -> list[float]:
    """Each client's local-only accuracy (the built-in MLP; spec.model must be empty), in the given order."""
    models = local_only_models(clients, seeds, spec, num_features, num_classes)
    return [float((logits(w, c.x_test).argmax(axis=1) == c.y_test).mean()) if len(c.y_test) else 0.0
            for w, c in zip(models, clients, strict=True)]


def local_only_models(clients: Sequence[ClientData], seeds: Sequence[int], spec: TrainSpec, num_features: int,
                      num_classes: int) -> list[Weights]:
    """Each client's MLP trained on its own data alone, in the given order."""
    if spec.model:
        raise ValueError("local_only_accuracies trains the built-in MLP only; a custom model trains in torch")
    if not clients:
        return []
    b, epochs = spec.batch_size, spec.local_only_epochs
    sizes = np.array([c.num_samples for c in clients])
    batches = -(-sizes // b)
    order = np.argsort(-batches, kind="stable")  # most batches first: the clients still training are a prefix
    data = [clients[i] for i in order]
    m = len(data)
    start = [init_weights(num_features, num_classes, spec.hidden, int(seeds[i])) for i in order]
    w0 = np.stack([s["0.weight"] for s in start])  # (m, hidden, features)
    b0 = np.stack([s["0.bias"] for s in start])
    w2 = np.stack([s["2.weight"] for s in start])  # (m, classes, hidden)
    b2 = np.stack([s["2.bias"] for s in start])
    params = [w0, b0, w2, b2]
    moment = [np.zeros_like(p) for p in params]
    started = np.zeros(m, dtype=bool)
    orders = [_orders(c.num_samples, epochs, int(seeds[i])) for c, i in zip(data, order, strict=True)]
    n_batches = batches[order]
    x = np.zeros((m, b, num_features), dtype=np.float32)
    onehot = np.zeros((m, b, num_classes), dtype=np.float32)
    rows = np.zeros((m, b, 1), dtype=np.float32)  # 1/batch for a real row, 0 for padding
    eye = np.eye(num_classes, dtype=np.float32)
    lr, mu = np.float32(spec.lr), np.float32(spec.momentum)
    for epoch in range(epochs):
        for step in range(int(n_batches[0])):
            k = int(np.count_nonzero(n_batches > step))  # the clients with a batch at this step: a prefix
            for j in range(k):
                index = orders[j][epoch][step * b:(step + 1) * b]
                r = len(index)
                x[j, :r] = data[j].x_train[index]
                x[j, r:] = 0.0
                onehot[j, :r] = eye[data[j].y_train[index]]
                onehot[j, r:] = 0.0
                rows[j, :r] = np.float32(1.0 / r)
                rows[j, r:] = 0.0
            grads = _gradients([p[:k] for p in params], x[:k], onehot[:k], rows[:k])
            first = ~started[:k]
            for p, v, g in zip(params, moment, grads, strict=True):
                # torch SGD: the buffer starts as the first gradient, then buf = momentum * buf + grad
                v[:k] = np.where(first.reshape((-1,) + (1,) * (g.ndim - 1)), g, mu * v[:k] + g)
                p[:k] -= lr * v[:k]
            started[:k] = True
    models: list[Weights] = [{} for _ in range(m)]
    for j in range(m):
        models[order[j]] = {"0.weight": w0[j], "0.bias": b0[j], "2.weight": w2[j], "2.bias": b2[j]}
    return models


def _gradients(params: list[np.ndarray], x: np.ndarray, onehot: np.ndarray,
               rows: np.ndarray) -> list[np.ndarray]:
    """Gradients of the mean cross-entropy over each client's real rows, for k stacked MLPs."""
    w0, b0, w2, b2 = params
    pre = np.matmul(x, w0.transpose(0, 2, 1)) + b0[:, None, :]
    h = np.maximum(pre, 0.0)
    z = np.matmul(h, w2.transpose(0, 2, 1)) + b2[:, None, :]
    z -= z.max(axis=2, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=2, keepdims=True)
    delta = (p - onehot) * rows  # d(mean loss)/dz; zero on padding rows
    g_w2 = np.matmul(delta.transpose(0, 2, 1), h)
    g_b2 = delta.sum(axis=1)
    dh = np.matmul(delta, w2) * (pre > 0)
    g_w0 = np.matmul(dh.transpose(0, 2, 1), x)
    g_b0 = dh.sum(axis=1)
    return [g_w0, g_b0, g_w2, g_b2]
