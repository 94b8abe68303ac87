"""A learnable federated dataset with natural per-user partitions, made lazily per user (LEAF-style).

LEAF's synthetic(alpha, beta) (Caldas et al.; Li et al., FedProx) gives every user its own softmax
model W_k ~ N(u_k, 1) and feature mean v_k ~ N(B_k, 1). Those user models share nothing, so no
global model fits them: a federated model stays near chance (issue 12 measured 0.09-0.12). Ours
keeps LEAF's generator but gives the users one shared model plus a user deviation:

    W_k = W0 + alpha E_k,  b_k = b0 + alpha e_k    (W0, b0, E_k, e_k ~ N(0, 1); alpha = model heterogeneity)
    v_k ~ N(B_k, 1),  B_k ~ N(0, beta)              (feature heterogeneity, as LEAF)
    x ~ N(v_k, diag(j^-1.2)),  y = argmax(x W_k + b_k)   (60 features, 10 classes, as LEAF)
    n_k = 50 + min(lognormal(4, 2), 1000) samples    (as LEAF)

Users differ in features, label mix (their feature means push different classes up) and size,
and the shared part is learnable. Every user is a pure function of (seed, user id): its size
comes from one vectorised draw over the population (so the server knows every partition size
without making any data) and its samples from its own sub-seed, made when first asked for and
kept in a small LRU. The global test and validation sets are the test splits of a seeded sample
of EVAL_USERS users (all users when there are fewer).
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import lru_cache

import numpy as np

from mlsyskit.core.sim import Seeds, sub_seed
from mlsyskit.tools.fl.config import DataSpec
from mlsyskit.tools.fl.task import ClientData

DIM, CLASSES = 60, 10
EVAL_USERS = 200
CACHE_USERS = 512  # made users kept in memory (a round touches per_round of them)


def count_test_split(n: int, fraction: float) -> int:
    """Samples of n that go to the test split (data._split_indices' rule)."""
    return max(1, int(round(n * fraction))) if n > 1 else 0


class SyntheticUsers(Sequence):
    """The population's users as a lazy sequence of ClientData (indexable, sized, made on demand)."""

    def __init__(self, spec: DataSpec) -> None:
        self.spec = spec
        seeds = Seeds(spec.seed)
        shared = seeds.numpy("synthetic/shared")
        self.w0, self.b0 = shared.normal(0, 1, (DIM, CLASSES)), shared.normal(0, 1, CLASSES)
        self.feature_sd = np.arange(1, DIM + 1, dtype=np.float64) ** -0.6  # sqrt of LEAF's diag(j^-1.2)
        raw = seeds.numpy("synthetic/sizes").lognormal(4, 2, spec.num_clients)
        self.total_sizes = 50 + np.minimum(raw, 1000).astype(np.int64)
        self.make = lru_cache(maxsize=CACHE_USERS)(self._make)

    def __len__(self) -> int:
        return self.spec.num_clients

    def __getitem__(self, user: int):  # type: ignore[override]
        if not isinstance(user, int | np.integer):
            raise TypeError("users are indexed one at a time")
        if not 0 <= user < len(self):
            raise IndexError(f"user {user} is outside 0..{len(self) - 1}")
        return self.make(int(user))

    def __iter__(self) -> Iterator:
        return (self[i] for i in range(len(self)))

    def train_sizes(self) -> tuple[int, ...]:
        f = self.spec.test_fraction
        return tuple(int(n) - count_test_split(int(n), f) for n in self.total_sizes)

    def _make(self, user: int) -> ClientData:
        spec, n = self.spec, int(self.total_sizes[user])
        rng = np.random.default_rng(sub_seed(spec.seed, f"synthetic/user/{user}"))
        feature_mean = rng.normal(rng.normal(0, spec.synthetic_beta), 1, DIM)
        w = self.w0 + spec.synthetic_alpha * rng.normal(0, 1, (DIM, CLASSES))
        b = self.b0 + spec.synthetic_alpha * rng.normal(0, 1, CLASSES)
        x = (feature_mean + rng.normal(0, 1, (n, DIM)) * self.feature_sd).astype(np.float32)
        y = np.argmax(x @ w + b, axis=1).astype(np.int64)
        order = rng.permutation(n)
        test, train = order[:count_test_split(n, spec.test_fraction)], order[count_test_split(n, spec.test_fraction):]
        return ClientData(user, x[train], y[train], x[test], y[test])

    def eval_users(self) -> list[int]:
        count = min(len(self), EVAL_USERS)
        rng = Seeds(self.spec.seed).numpy("synthetic/eval-users")
        return sorted(int(u) for u in rng.choice(len(self), size=count, replace=False))


def held_out(users: SyntheticUsers) -> tuple[np.ndarray, np.ndarray]:
    """The test splits of the evaluation users, concatenated (the global held-out data)."""
    parts = [users[u] for u in users.eval_users()]
    return np.concatenate([p.x_test for p in parts]), np.concatenate([p.y_test for p in parts])
