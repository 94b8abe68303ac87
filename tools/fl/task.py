"""What each party holds: a client's own arrays (ClientData) and the server's (ServerData).

A client holds its training and test samples and nothing else; the server holds only the task's
shape (input features, classes), a small root/validation set (FLTrust's root dataset: TIFF
verifies every update against it and the job keeps the model that scores best on it) and a test
set for reporting. Nothing here loads data: loaders (data.py for experiments, local_data.py for a
client's or the server's own files) build these.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mlsyskit.tools.fl.model import Weights
from mlsyskit.tools.fl.scaling import InputScaling


@dataclass(frozen=True)
class ClientData:
    client_id: int
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    @property
    def num_samples(self) -> int:
        return len(self.y_train)


@dataclass(frozen=True)
class ServerData:
    """The task and the server's own sets. `evaluator`, when given, replaces evaluation on these sets
    (the scheduling harness scores a synthetic learning curve, not a model)."""

    num_features: int
    num_classes: int
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    evaluator: Callable[[Weights], dict[str, float]] | None = None
    input_scaling: InputScaling | None = None  # already applied to x_val and x_test; clients apply it to theirs

    def task(self) -> dict:
        """What a client is told about the data: the shape of the task and the job's input scaling."""
        shape = {"num_features": self.num_features, "num_classes": self.num_classes}
        return shape if self.input_scaling is None else shape | self.input_scaling.to_task()
