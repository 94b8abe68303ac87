"""Your own data are standardized with the server's root-set statistics (tools/fl/scaling.py).

The repro: scikit-learn's wine data as they come (one feature in the thousands, others in tenths)
taught the built-in MLP nothing, FedAvg and TIFF alike (chance accuracy; a real federation rejected
honest updates as pointing away from the validation data); standardized they learn.
"""
from __future__ import annotations

import sys
import types

import numpy as np
import pytest
from sklearn.datasets import load_wine

from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.config import DataSpec, JobConfig, TrainSpec
from mlsyskit.tools.fl.data import load_federated
from mlsyskit.tools.fl.local_data import load_client_data, load_server_data
from mlsyskit.tools.fl.scaling import InputScaling
from mlsyskit.tools.fl.simulator import Simulation

WINE = "wine_as_it_comes:load"


@pytest.fixture(autouse=True)
def wine_module(monkeypatch):
    module = types.ModuleType("wine_as_it_comes")
    module.load = lambda num_clients, seed: load_wine(return_X_y=True)
    monkeypatch.setitem(sys.modules, "wine_as_it_comes", module)


def test_statistics_shift_a_constant_feature_only_and_travel_exactly():
    x = np.array([[1.0, 5.0, 1000.0], [3.0, 5.0, 3000.0]], np.float32)
    scaling = InputScaling.of(x)
    assert scaling.shift.tolist() == [2.0, 5.0, 2000.0] and scaling.scale.tolist() == [1.0, 1.0, 1000.0]
    assert scaling.apply(x).tolist() == [[-1.0, 0.0, -1.0], [1.0, 0.0, 1.0]]
    task = {"num_features": 3, "num_classes": 2} | scaling.to_task()
    back = InputScaling.from_task(task, 3)
    assert np.array_equal(back.shift, scaling.shift) and np.array_equal(back.scale, scaling.scale)
    assert InputScaling.from_task({"num_features": 3, "num_classes": 2}, 3) is None
    for bad in ({"input_shift": [0.0] * 3}, task | {"input_scale": [1.0, 0.0, 1.0]}, task | {"input_shift": [0.0]},
                task | {"input_scale": "x"}):
        with pytest.raises(ValueError, match="input scaling"):
            InputScaling.from_task(bad, 3)
    with pytest.raises(ValueError, match="3 features"):
        scaling.apply(np.zeros((2, 4), np.float32))


def test_the_servers_sets_are_scaled_by_the_root_set_and_its_task_tells_clients(tmp_path):
    x, y = load_wine(return_X_y=True)
    np.savez(tmp_path / "validation.npz", x=x[:60], y=y[:60])
    np.savez(tmp_path / "test.npz", x=x[60:120], y=y[60:120])
    np.savez(tmp_path / "client.npz", x=x[120:], y=y[120:])
    server = load_server_data(str(tmp_path), input_scaling="standardize")
    assert np.allclose(server.x_val.mean(axis=0), 0, atol=1e-5) and np.allclose(server.x_val.std(axis=0), 1, atol=1e-4)
    scaling = InputScaling.from_task(server.task(), server.num_features)
    assert np.allclose(server.x_test, scaling.apply(x[60:120].astype(np.float32)))
    client = scaling.applied_to(load_client_data(str(tmp_path / "client.npz"), 0))
    assert np.abs(client.x_train).max() < 10 and client.num_samples + len(client.y_test) == len(y) - 120
    as_is = load_server_data(str(tmp_path), input_scaling="none")
    assert as_is.input_scaling is None and set(as_is.task()) == {"num_features", "num_classes"}
    assert np.array_equal(as_is.x_val, x[:60].astype(np.float32))


def _accuracy(input_scaling: str, strategy: str) -> float:
    config = JobConfig(strategy=strategy, rounds=6, per_round=3, seed=1, train=TrainSpec(local_only_epochs=2),
                       data=DataSpec(dataset=WINE, num_clients=3, partition="iid", seed=1, input_scaling=input_scaling))
    with MetaStore(":memory:") as store:
        result = Simulation(config, store).run()
    return max(o.global_metrics["accuracy"] for o in result.outcomes)


@pytest.mark.parametrize("strategy", ["fedavg", "tiff+fedadam-sfcap"])
def test_raw_wine_learns_only_standardized(strategy):
    assert _accuracy("standardize", strategy) >= 0.9
    assert _accuracy("none", strategy) <= 0.5  # the repro: as they come, three classes stay at chance


def test_a_loader_dataset_is_standardized_by_default_and_partition_keeps_it_as_it_is(tmp_path):
    scaled = load_federated(DataSpec(dataset=WINE, num_clients=3, seed=1))
    raw = load_federated(DataSpec(dataset=WINE, num_clients=3, seed=1, input_scaling="none"))
    scaling = InputScaling.of(raw.x_val)
    assert np.array_equal(scaled.x_val, scaling.apply(raw.x_val))
    assert all(np.array_equal(s.x_train, scaling.apply(r.x_train)) for s, r in zip(scaled.clients, raw.clients,
                                                                                    strict=True))
    digits = load_federated(DataSpec(dataset="digits", num_clients=3, seed=1))
    assert digits.x_val.min() >= 0 and digits.x_val.max() <= 1  # built-in datasets run as prepared
