"""Federated datasets: real digits and breast-cancer (scikit-learn), MNIST-1D (procedural), LEAF-style synthetic.

`load_federated(spec)` returns every client's train/test split plus a global held-out test set;
it is a pure function of the DataSpec (seeded), so a client process that knows only the spec
and its id rebuilds exactly the partition the server and the simulator use.
"""
from __future__ import annotations

import gzip
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from mlsyskit.core.sim import Seeds
from mlsyskit.tools.fl.config import OWN_DATA, DataSpec
from mlsyskit.tools.fl.leaf_synthetic import CLASSES, DIM, SyntheticUsers, held_out
from mlsyskit.tools.fl.plugins import is_target, load_dataset
from mlsyskit.tools.fl.scaling import standardizer
from mlsyskit.tools.fl.task import ClientData, ServerData

MIN_CLIENT_SAMPLES = 4
DIRICHLET_TRIES = 200
MNIST1D_PER_CLIENT = 20


@dataclass(frozen=True)
class FederatedData:
    clients: Sequence[ClientData]  # a tuple, or a lazy sequence that makes a client when indexed (synthetic)
    x_test: np.ndarray  # global held-out test set: the accuracy every report gives
    y_test: np.ndarray
    num_features: int
    num_classes: int
    # the server's own validation split (disjoint from the test set): it scores every update before it is
    # accepted or paid, and picks the model the job keeps; tuning on it never touches the reported accuracy
    x_val: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    y_val: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def server_side(self) -> ServerData:
        """What this experiment's server holds: the task, its validation split and the test set."""
        return ServerData(self.num_features, self.num_classes, self.x_val, self.y_val, self.x_test, self.y_test)

    def partition_sizes(self) -> tuple[int, ...]:
        """Every client's training-sample count, without making a lazy client's data."""
        sizes = getattr(self.clients, "train_sizes", None)
        return sizes() if sizes is not None else tuple(c.num_samples for c in self.clients)


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


def _breast_cancer() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's Wisconsin breast-cancer set (569 real samples, 30 features, 2 classes), z-scored."""
    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.origin).parent / "datasets" / "data" / "breast_cancer.csv" if spec and spec.origin else None
    if path is not None and path.is_file():
        table = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.float64)
        x, y = table[:, :-1], table[:, -1].astype(np.int64)
    else:
        from sklearn.datasets import load_breast_cancer

        x, y = load_breast_cancer(return_X_y=True)
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    return x.astype(np.float32), y.astype(np.int64)


def _mnist1d(seed: int, num_clients: int) -> tuple[np.ndarray, np.ndarray]:
    """MNIST-1D's 5,000 samples, or MNIST1D_PER_CLIENT per client when that is more (1,000 clients: 20,000),
    so a many-client job still gives every client data to learn from (same generator, more draws)."""
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.seed = seed
    args.num_samples = max(args.num_samples, MNIST1D_PER_CLIENT * num_clients)
    state = np.random.get_state()  # make_dataset reseeds numpy's global RNG; leave it as we found it
    try:
        data = make_dataset(args)
    finally:
        np.random.set_state(state)
    x = np.concatenate([data["x"], data["x_test"]]).astype(np.float32)
    y = np.concatenate([data["y"], data["y_test"]]).astype(np.int64)
    return x, y


def _split_indices(n: int, fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    order = rng.permutation(n)
    n_test = max(1, int(round(n * fraction))) if n > 1 else 0
    return order[n_test:], order[:n_test]


def _split_train_test(x: np.ndarray, y: np.ndarray, fraction: float, rng: np.random.Generator):
    train, test = _split_indices(len(y), fraction, rng)
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
    for _ in range(DIRICHLET_TRIES):  # resample until every client has enough data (the usual FL benchmark recipe)
        parts: list[list[int]] = [[] for _ in range(clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            shares = rng.dirichlet(np.full(clients, spec.alpha))
            cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(int)
            for client, chunk in enumerate(np.split(idx, cuts)):
                parts[client].extend(chunk.tolist())
        if min(len(p) for p in parts) >= MIN_CLIENT_SAMPLES:
            return [np.sort(np.array(p, dtype=np.int64)) for p in parts]
    # strong skew with many clients (alpha 0.1, 50 clients on digits) leaves some client almost empty in
    # every per-class draw: fall back to per-client label mixtures with equal sizes (Hsu et al. 2019)
    return _dirichlet_per_client(labels, classes, spec, rng)


def _dirichlet_per_client(labels: np.ndarray, classes: np.ndarray, spec: DataSpec,
                          rng: np.random.Generator) -> list[np.ndarray]:
    """Each client draws its label mix q ~ Dirichlet(alpha) and n/N samples from it, without replacement;
    a class that runs out is dropped from the remaining draws."""
    pools = [list(rng.permutation(np.flatnonzero(labels == c))) for c in classes]
    sizes = np.full(spec.num_clients, len(labels) // spec.num_clients)
    sizes[:len(labels) % spec.num_clients] += 1
    parts = []
    for size in sizes:
        mix = rng.dirichlet(np.full(len(classes), spec.alpha))
        chosen: list[int] = []
        for _ in range(size):
            left = np.array([len(p) > 0 for p in pools])
            weights = np.where(left, mix, 0.0)
            weights = weights / weights.sum() if weights.sum() > 0 else left / left.sum()
            chosen.append(pools[int(rng.choice(len(classes), p=weights))].pop())
        parts.append(np.sort(np.array(chosen, dtype=np.int64)))
    return parts


def _synthetic(spec: DataSpec, seeds: Seeds) -> FederatedData:
    """LEAF-style synthetic(alpha, beta) with a shared model part, users made lazily (leaf_synthetic.py)."""
    users = SyntheticUsers(spec)
    x_held, y_held = held_out(users)
    return with_validation(users, x_held, y_held, DIM, CLASSES, seeds)


@lru_cache(maxsize=4)
def load_federated(spec: DataSpec) -> FederatedData:
    if spec.dataset == OWN_DATA:
        raise ValueError("this job's clients hold their own data (dataset 'own'): there is nothing to partition; "
                         "name a dataset (--dataset) to simulate or partition one")
    seeds = Seeds(spec.seed)
    if spec.dataset == "synthetic":
        return _synthetic(spec, seeds)
    if is_target(spec.dataset):
        return _custom(spec, seeds)
    if spec.dataset == "digits":
        x, y = _digits()
    elif spec.dataset == "breast-cancer":
        x, y = _breast_cancer()
    else:
        x, y = _mnist1d(seeds.seed("mnist1d") % (2**31), spec.num_clients)
    x_pool, y_pool, x_held, y_held = _split_train_test(x, y, spec.test_fraction, seeds.numpy("global-split"))
    parts = partition_indices(y_pool, spec, seeds.numpy("partition"))
    split_rng = seeds.numpy("client-split")
    clients = tuple(ClientData(i, *_split_train_test(x_pool[p], y_pool[p], spec.test_fraction, split_rng))
                    for i, p in enumerate(parts))
    return with_validation(clients, x_held, y_held, x.shape[1], int(y.max()) + 1, seeds)


def _custom(spec: DataSpec, seeds: Seeds) -> FederatedData:
    """A `package.module:loader` dataset: its partition if it gives one (client_of), else the job's."""
    x, y, client_of = load_dataset(spec.dataset, spec.num_clients, spec.seed)
    pool, held = _split_indices(len(y), spec.test_fraction, seeds.numpy("global-split"))
    x_pool, y_pool, x_held, y_held = x[pool], y[pool], x[held], y[held]
    if client_of is None:
        parts = partition_indices(y_pool, spec, seeds.numpy("partition"))
    else:  # the held-out split is taken first, then every client keeps the rest of its samples
        parts = [np.flatnonzero(client_of[pool] == cid) for cid in range(spec.num_clients)]
        empty = [cid for cid, p in enumerate(parts) if len(p) < 2]
        if empty:
            raise ValueError(f"--dataset {spec.dataset!r} leaves clients {empty[:5]} with fewer than 2 samples")
    split_rng = seeds.numpy("client-split")
    clients = tuple(ClientData(i, *_split_train_test(x_pool[p], y_pool[p], spec.test_fraction, split_rng))
                    for i, p in enumerate(parts))
    data = with_validation(clients, x_held, y_held, x.shape[1], int(y.max()) + 1, seeds)
    scaling = standardizer(data.x_val, spec.input_scaling)  # your data: as a real run's server and clients do
    if scaling is None:
        return data
    return replace(data, clients=tuple(scaling.applied_to(c) for c in data.clients),
                   x_test=scaling.apply(data.x_test), x_val=scaling.apply(data.x_val))


def with_validation(clients: Sequence[ClientData], x_held: np.ndarray, y_held: np.ndarray, num_features: int,
                    num_classes: int, seeds: Seeds) -> FederatedData:
    """Split the held-out data in half: the server's validation split and the reported test set."""
    x_test, y_test, x_val, y_val = _split_train_test(x_held, y_held, 0.5, seeds.numpy("validation-split"))
    return FederatedData(clients, x_test, y_test, num_features, num_classes, x_val, y_val)


def load_client(spec: DataSpec, client_id: int) -> tuple[ClientData, int, int]:
    """One client's data and the (num_features, num_classes) of the task."""
    if not 0 <= client_id < spec.num_clients:
        raise ValueError(f"client id {client_id} is outside 0..{spec.num_clients - 1}")
    data = load_federated(spec)
    return data.clients[client_id], data.num_features, data.num_classes
