"""`fl-server partition`: one dataset split into per-client folders, to try a real federation on one machine.

The split is the simulator's (data.load_federated: IID, Dirichlet label skew or shards, seeded), so
`simulate` and a real run on the same spec see the same clients. The files hold the samples as they
are; `fl-server run` standardizes every party's data with its root set's statistics (scaling.py),
as `simulate` does for a package.module:loader dataset (the built-in ones it runs as prepared). Layout (local_data.py reads it):
    OUT/task.json                       the task (features, classes) and how the split was made
    OUT/server/validation.npz, test.npz the server's root/validation set and test set (held out), task.json
    OUT/client-K/train.npz, test.npz    client K's own data (x, y), nothing else
Folders are made private to their owner (0700), files 0600: hand each client process only its folder.
"""
from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from mlsyskit.tools.fl.config import DataSpec
from mlsyskit.tools.fl.data import load_federated


def _save(folder: Path, name: str, x: np.ndarray, y: np.ndarray) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    path = folder / name
    np.savez(path, x=x, y=y)
    os.chmod(path, 0o600)


def write_partition(spec: DataSpec, out: Path) -> dict[str, Any]:
    # the folders hold the data as they are: a real run's server scales them (DataSpec.input_scaling)
    data = load_federated(replace(spec, input_scaling="none"))
    out.mkdir(parents=True, exist_ok=True)
    _save(out / "server", "validation.npz", data.x_val, data.y_val)
    _save(out / "server", "test.npz", data.x_test, data.y_test)
    sizes = {}
    for cid in range(spec.num_clients):
        client = data.clients[cid]
        _save(out / f"client-{cid}", "train.npz", client.x_train, client.y_train)
        _save(out / f"client-{cid}", "test.npz", client.x_test, client.y_test)
        sizes[cid] = client.num_samples
    task = {"num_features": data.num_features, "num_classes": data.num_classes, "dataset": spec.dataset,
            "clients": spec.num_clients, "partition": spec.partition, "alpha": spec.alpha, "seed": spec.seed}
    for folder in (out, out / "server"):
        (folder / "task.json").write_text(json.dumps(task, indent=1) + "\n")
    return {"out": str(out), **task, "validation": len(data.y_val), "test": len(data.y_test),
            "clients": {str(c): n for c, n in sizes.items()}}
