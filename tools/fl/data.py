"""Federated datasets: real digits (scikit-learn), MNIST-1D (procedural), LEAF-style synthetic(alpha, beta).

`load_federated(spec)` returns every client's train/test split plus a global held-out test set;
it is a pure function of the DataSpec (seeded), so a client process that knows only the spec
and its id rebuilds exactly the partition the server and the simulator use.
"""
from __future__ import annotations

import gzip
import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from mlsyskit.core.sim import Seeds
from mlsyskit.tools.fl.config import DataSpec

MIN_CLIENT_SAMPLES = 4


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
class FederatedData:
    clients: tuple[ClientData, ...]
    x_test: np.ndarray  # global held-out set the server evaluates on
    y_test: np.ndarray
    num_features: int
    num_classes: int


def _digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits (1,797 real images), read from the file it ships.

    Reading digits.csv.gz directly skips importing scikit-learn (about a second), which keeps
    fl-server start-up short; load_digits() is the fallback if the file ever moves.
    """
    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None
    if path is not None and path.is_file():
        with gzip.open(path, "rt") as f:
            table = np.loadtxt(f, delimiter=",", dtype=np.float32)
        return table[:, :-1] / 16.0, table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    digits = load_digits()
    return (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int64)


def _mnist1d(seed: int) -> tuple[np.ndarray, np.ndarray]:
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.seed = seed
    state = np.random.get_state()  # make_dataset reseeds numpy's global RNG; leave it as we found it
    try:
        data = make_dataset(args)
    finally:
        np.random.set_state(state)
    x = np.concatenate([data["x"], data["x_test"]]).astype(np.float32)
    y = np.concatenate([data["y"], data["y_test"]]).astype(np.int64)
    return x, y


def _split_train_test(x: np.ndarray, y: np.ndarray, fraction: float, rng: np.random.Generator):
    order = rng.permutation(len(y))
    n_test = max(1, int(round(len(y) * fraction))) if len(y) > 1 else 0
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def partition_indices(labels: np.ndarray, spec: DataSpec, rng: np.random.Generator) -> list[np.ndarray]:
    """Indices of `labels` for each client: IID, Dirichlet(alpha) label skew, or label-sorted shards."""
    n, clients = len(labels), spec.num_clients
    if n < clients * MIN_CLIENT_SAMPLES:
        raise ValueError(f"{n} samples cannot give {clients} clients {MIN_CLIENT_SAMPLES} samples each")
    if spec.partition == "iid":
        return [np.sort(part) for part in np.array_split(rng.permutation(n), clients)]
    if spec.partition == "shards":
        shards = np.array_split(np.argsort(labels, kind="stable"), clients * spec.shards_per_client)
        order = rng.permutation(len(shards))
        return [np.sort(np.concatenate([shards[j] for j in order[i::clients]])) for i in range(clients)]
    classes = np.unique(labels)
    for _ in range(1000):  # resample until every client has enough data (the usual FL benchmark recipe)
        parts: list[list[int]] = [[] for _ in range(clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            shares = rng.dirichlet(np.full(clients, spec.alpha))
            cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(int)
            for client, chunk in enumerate(np.split(idx, cuts)):
                parts[client].extend(chunk.tolist())
        if min(len(p) for p in parts) >= MIN_CLIENT_SAMPLES:
            return [np.sort(np.array(p, dtype=np.int64)) for p in parts]
    raise ValueError(f"Dirichlet(alpha={spec.alpha}) could not give every one of {clients} clients "
                     f"{MIN_CLIENT_SAMPLES} samples; raise alpha or lower the number of clients")


def _synthetic(spec: DataSpec, seeds: Seeds) -> FederatedData:
    """LEAF synthetic(alpha, beta) (Li et al., FedProx): each client has its own softmax model and features."""
    rng = seeds.numpy("synthetic")
    dim, classes = 60, 10
    sigma = np.diag(np.arange(1, dim + 1, dtype=np.float64) ** -1.2)
    clients = []
    for k in range(spec.num_clients):
        n = int(min(rng.lognormal(4, 2), 1000)) + 50
        u = rng.normal(0, spec.synthetic_alpha)
        b_mean = rng.normal(0, spec.synthetic_beta)
        w, b = rng.normal(u, 1, (dim, classes)), rng.normal(u, 1, classes)
        v = rng.normal(b_mean, 1, dim)
        x = rng.multivariate_normal(v, sigma, n).astype(np.float32)
        y = np.argmax(x @ w + b, axis=1).astype(np.int64)
        clients.append(ClientData(k, *_split_train_test(x, y, spec.test_fraction, rng)))
    x_test = np.concatenate([c.x_test for c in clients])
    y_test = np.concatenate([c.y_test for c in clients])
    return FederatedData(tuple(clients), x_test, y_test, dim, classes)


@lru_cache(maxsize=4)
def load_federated(spec: DataSpec) -> FederatedData:
    seeds = Seeds(spec.seed)
    if spec.dataset == "synthetic":
        return _synthetic(spec, seeds)
    x, y = _digits() if spec.dataset == "digits" else _mnist1d(seeds.seed("mnist1d") % (2**31))
    x_pool, y_pool, x_test, y_test = _split_train_test(x, y, spec.test_fraction, seeds.numpy("global-split"))
    parts = partition_indices(y_pool, spec, seeds.numpy("partition"))
    split_rng = seeds.numpy("client-split")
    clients = tuple(ClientData(i, *_split_train_test(x_pool[p], y_pool[p], spec.test_fraction, split_rng))
                    for i, p in enumerate(parts))
    return FederatedData(clients, x_test, y_test, x.shape[1], int(y.max()) + 1)


def load_client(spec: DataSpec, client_id: int) -> tuple[ClientData, int, int]:
    """One client's data and the (num_features, num_classes) of the task."""
    if not 0 <= client_id < spec.num_clients:
        raise ValueError(f"client id {client_id} is outside 0..{spec.num_clients - 1}")
    data = load_federated(spec)
    return data.clients[client_id], data.num_features, data.num_classes
