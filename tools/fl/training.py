"""Local training on a client, with TIFF's overhead-free quality signal and the malicious behaviours.

Quality (TIFF): the accuracy of the received global model on the provider's own training
samples, read from the forward passes of its first local epoch before any update. To make
"before any update" exact, the first epoch accumulates the gradients of all its minibatches
and takes one optimiser step at its end (a full-batch step computed batch by batch), so every
one of its forward passes runs on the unchanged global model; later epochs are plain minibatch
SGD. The signal therefore costs one argmax per batch and no extra pass. (Scoring each batch
before its own step under minibatch SGD instead lets the model drift toward the client's labels
within the epoch: a label-flipper with 150+ samples then scores 0.3-0.6 instead of ~0.01.)
A label-flipper scores low because the global model predicts the true labels.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import nn

from mlsyskit.tools.fl.baseline import local_only_accuracies
from mlsyskit.tools.fl.config import ATTACKS, TrainSpec
from mlsyskit.tools.fl.data import ClientData
from mlsyskit.tools.fl.model import Weights, init_weights
from mlsyskit.tools.fl.torch_model import Sgd, accuracy, build_model, get_weights, loaded_model, set_weights

NOISY_LABEL_RATE = 0.8
SCALE_FACTOR = 10.0  # the `scaled` attacker boosts its update by this much (model-replacement style)
FREE_RIDER_NOISE = 1e-4  # relative size of the noise a free-rider adds so its weights are not bit-identical
LIED_QUALITY = 0.99  # what a quality liar claims


@dataclass(frozen=True)
class LocalResult:
    weights: Weights
    num_samples: int
    loss: float  # mean training loss of the last local epoch
    quality: float
    train_time_s: float  # measured wall time of local training
    cpu_time_s: float  # measured process CPU time of local training
    consumer_accuracy: float  # received global model on this client's own test split (for the utility ratio)

    def metrics(self) -> dict[str, float]:
        return {"num_samples": self.num_samples, "loss": self.loss, "quality": self.quality,
                "train_time_s": self.train_time_s, "cpu_time_s": self.cpu_time_s,
                "cpu_percent": 100.0 * self.cpu_time_s / max(self.train_time_s, 1e-9),
                "consumer_accuracy": self.consumer_accuracy}


def poisoned_labels(y: np.ndarray, attack: str, num_classes: int, rng: np.random.Generator) -> np.ndarray:
    """The labels a client trains on: its true ones, or the attack's."""
    if attack not in ATTACKS:
        raise ValueError(f"unknown attack {attack!r}; choose from {', '.join(ATTACKS)}")
    if attack == "label-flip":
        return (num_classes - 1 - y).astype(np.int64)
    if attack in ("noisy-labels", "quality-liar"):  # the liar trains on mostly random labels, claims 0.99
        noisy = y.copy()
        mask = rng.random(len(y)) < NOISY_LABEL_RATE
        noisy[mask] = rng.integers(0, num_classes, int(mask.sum()))
        return noisy
    return y


def _train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, spec: TrainSpec, epochs: int,
           generator: torch.Generator, exact_first_epoch: bool = True) -> tuple[float, float]:
    """Train for `epochs`; returns (accuracy of the starting model from epoch 1's forward passes,
    mean loss of the last epoch). With `exact_first_epoch`, epoch 1 is one accumulated step."""
    optimiser = Sgd(model.parameters(), lr=spec.lr, momentum=spec.momentum)  # torch.optim.SGD's arithmetic
    correct, last_loss, n = 0, 0.0, max(len(y), 1)
    for epoch in range(epochs):
        accumulate = exact_first_epoch and epoch == 0
        order = torch.randperm(len(y), generator=generator)
        total = 0.0
        optimiser.zero_grad()
        for start in range(0, len(y), spec.batch_size):
            batch = order[start:start + spec.batch_size]
            logits = model(x[batch])
            if epoch == 0:
                correct += int((logits.argmax(dim=1) == y[batch]).sum())
            loss = nn.functional.cross_entropy(logits, y[batch])
            if accumulate:  # weight by batch size: the epoch's gradient is the full-batch mean
                (loss * (len(batch) / n)).backward()
            else:
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
            total += loss.item() * len(batch)
        if accumulate:
            optimiser.step()
        last_loss = total / n
    return correct / n, last_loss


def train_local(global_weights: Weights, data: ClientData, spec: TrainSpec, num_features: int, num_classes: int,
                seed: int, attack: str = "none") -> LocalResult:
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    model = loaded_model(num_features, num_classes, spec.hidden, spec.model, global_weights)
    consumer_accuracy = accuracy(model, data.x_test, data.y_test)
    if attack == "free-rider":  # trains nothing: sends the global model back (plus a hair of noise), claims 0.99
        weights = {k: (v + rng.normal(0.0, FREE_RIDER_NOISE * (float(np.abs(v).mean()) or 1.0), v.shape)).astype(v.dtype)
                   for k, v in global_weights.items()}
        return LocalResult(weights, data.num_samples, 0.01, LIED_QUALITY, 0.0, 0.0, consumer_accuracy)
    labels = poisoned_labels(data.y_train, attack, num_classes, rng)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    quality, loss = _train(model, torch.from_numpy(data.x_train), torch.from_numpy(labels), spec, spec.epochs,
                           generator)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    weights = _tamper(get_weights(model), global_weights, attack, rng)
    if attack == "quality-liar":
        quality = LIED_QUALITY
    return LocalResult(weights, data.num_samples, loss, quality, wall, cpu, consumer_accuracy)


def warm_up(num_features: int, num_classes: int, spec: TrainSpec) -> None:
    """Pay torch's first-use costs (lazy imports and kernel set-up of the first forward, backward and SGD
    step: seconds on a loaded machine) before the first timed round, on throw-away zeros. Without it a
    client's first `train_time_s` says it is several times slower than it is, and a scheduler's latency
    estimate (an EMA) carries that for rounds."""
    weights = init_weights(num_features, num_classes, spec.hidden, 0, spec.model)
    model = loaded_model(num_features, num_classes, spec.hidden, spec.model, weights)
    x = torch.zeros((2, num_features), dtype=torch.float32)
    y = torch.zeros(2, dtype=torch.int64)
    _train(model, x, y, replace(spec, epochs=2, batch_size=1), 2, torch.Generator().manual_seed(0))
    accuracy(model, x.numpy(), y.numpy())


def _tamper(weights: Weights, global_weights: Weights, attack: str, rng: np.random.Generator) -> Weights:
    """What the update-level attackers send instead of their honestly trained model (they report honestly)."""
    if attack not in ("random-update", "sign-flip", "scaled"):
        return weights
    delta = {k: v.astype(np.float64) - global_weights[k] for k, v in weights.items()}
    if attack == "random-update":  # Gaussian noise with the norm of the honest update, so norm bounds pass it
        noise = {k: rng.normal(0.0, 1.0, v.shape) for k, v in delta.items()}
        scale = np.sqrt(sum((d ** 2).sum() for d in delta.values()) / sum((n ** 2).sum() for n in noise.values()))
        delta = {k: n * scale for k, n in noise.items()}
    elif attack == "sign-flip":  # same norm, opposite direction: undoes the other providers' progress
        delta = {k: -d for k, d in delta.items()}
    else:
        delta = {k: SCALE_FACTOR * d for k, d in delta.items()}
    return {k: (global_weights[k] + d).astype(weights[k].dtype) for k, d in delta.items()}


def optimizer_steps(num_samples: int, spec: TrainSpec) -> int:
    """Optimiser steps of one local training: one accumulated step for epoch 1, then minibatch SGD."""
    return 1 + (spec.epochs - 1) * -(-num_samples // spec.batch_size)


def local_only_accuracy(data: ClientData, spec: TrainSpec, num_features: int, num_classes: int, seed: int) -> float:
    """Accuracy on the client's own test split of a model trained on its own data alone (the UIR baseline);
    the built-in MLP trains in baseline.py (numpy, the same steps), a custom model here in torch."""
    if not spec.model:
        return local_only_accuracies([data], [seed], spec, num_features, num_classes)[0]
    model = build_model(num_features, num_classes, spec.hidden, spec.model)
    set_weights(model, init_weights(num_features, num_classes, spec.hidden, seed, spec.model))
    generator = torch.Generator().manual_seed(seed)
    _train(model, torch.from_numpy(data.x_train), torch.from_numpy(data.y_train), spec, spec.local_only_epochs,
           generator, exact_first_epoch=False)
    return accuracy(model, data.x_test, data.y_test)
