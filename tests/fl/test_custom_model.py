"""Your own model and data: `package.module:factory` / `package.module:loader` targets, a small CNN, shapes
checked at registration, weights as raw buffers, and a clear error for every malformed target."""
from __future__ import annotations

import sys
import types

import numpy as np
import pytest
from torch import nn

from mlsyskit.core.config import ConfigError
from mlsyskit.core.rpc_codec import decode, encode
from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.config import DataSpec, JobConfig, TrainSpec
from mlsyskit.tools.fl.coordinator import Coordinator
from mlsyskit.tools.fl.data import load_federated
from mlsyskit.tools.fl.model import init_weights, shapes
from mlsyskit.tools.fl.plugins import PluginError, load_dataset, load_object
from mlsyskit.tools.fl.simulator import Simulation

CNN = "mlsyskit.tools.fl.examples.digits_cnn:small_cnn"
LOADER = "mlsyskit.tools.fl.examples.digits_cnn:digits_two_labels_per_client"


def cnn_job(strategy: str = "fedavg", rounds: int = 4, dataset: str = LOADER) -> JobConfig:
    # local_only_epochs 2, not 20: the consumers' local-only baselines (every client's CNN trained alone at the
    # job's end, the refunds' reference) were 3/4 of a run's CPU and are not what these tests check
    return JobConfig(strategy=strategy, rounds=rounds, per_round=5, seed=3,
                     train=TrainSpec(model=CNN, epochs=2, local_only_epochs=2),
                     data=DataSpec(dataset=dataset, num_clients=10, alpha=1.0, seed=3))


def test_loader_partition_is_used_and_deterministic():
    data = load_federated(DataSpec(dataset=LOADER, num_clients=10, seed=3))
    assert data.num_features == 64 and data.num_classes == 10 and len(data.clients) == 10
    for c in data.clients:  # client c holds labels c and c+1 only
        assert set(np.unique(np.concatenate([c.y_train, c.y_test]))) <= {c.client_id % 10, (c.client_id + 1) % 10}
    total = sum(len(c.y_train) + len(c.y_test) for c in data.clients) + len(data.y_test) + len(data.y_val)
    assert total == 1797
    again = load_federated(DataSpec(dataset=LOADER, num_clients=10, seed=3))
    assert all(np.array_equal(a.x_train, b.x_train) for a, b in zip(data.clients, again.clients, strict=True))


@pytest.mark.parametrize("strategy, dataset", [("fedavg", "digits"), ("tiff", "digits"), ("tiff", LOADER)])
def test_a_cnn_trains_federated_with_both_strategies_and_a_custom_loader(strategy, dataset):
    config = cnn_job(strategy, dataset=dataset)
    with MetaStore(":memory:") as store:
        sim = Simulation(config, store)
        result = sim.run()
        weights = sim.coordinator.weights
        assert abs(sim.coordinator.ledger.total()) < 1e-9
    assert any(w.ndim == 4 for w in weights.values())  # conv kernels, not the MLP
    assert set(weights) == set(nn.Module.state_dict(load_object(CNN, "--model")(64, 10)))
    if dataset == "digits":  # 10 classes, chance 0.1 (two labels per client, the loader's split, learns slower)
        assert max(o.global_metrics["accuracy"] for o in result.outcomes) > 0.3
    assert sum(r.status == "valid" for o in result.outcomes for r in o.reports.values()) >= len(result.outcomes)


def test_initial_weights_are_seeded_and_travel_as_raw_buffers():
    a, b = init_weights(64, 10, 0, seed=5, model=CNN), init_weights(64, 10, 0, seed=5, model=CNN)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not all(np.array_equal(a[k], init_weights(64, 10, 0, seed=6, model=CNN)[k]) for k in a)
    payload = encode(a)
    assert b"numpy" not in payload and b"torch" not in payload  # no pickled classes, only dtype/shape headers
    back = decode(payload)
    assert all(np.array_equal(a[k], back[k]) and a[k].dtype == back[k].dtype for k in a)


def test_registration_refuses_a_client_whose_model_has_other_shapes():
    config = cnn_job(rounds=1)
    with MetaStore(":memory:") as store:
        c = Coordinator(config, store)
        good = {name: list(shape) for name, shape in shapes(c.weights).items()}
        c.register(0, {"num_samples": c.partition_sizes[0], "shapes": good})
        mlp = shapes(init_weights(64, 10, 64, seed=0))
        with pytest.raises(ValueError, match="client 1: the client's model differs from the server's"):
            c.register(1, {"num_samples": c.partition_sizes[1], "shapes": mlp})
        wrong = dict(good, **{"head.weight": [10, 1]})
        with pytest.raises(ValueError, match=r"head.weight \(server \[10, 256\], client \[10, 1\]\)"):
            c.register(2, {"num_samples": c.partition_sizes[2], "shapes": wrong})
        assert set(c.clients) == {0}


@pytest.fixture
def plugin_module():
    module = types.ModuleType("flb_plugins_under_test")
    module.not_a_module = lambda num_features, num_classes: "a string"
    module.constant = 3
    module.bad_shapes = lambda num_clients, seed: (np.zeros(5, np.float32), np.zeros(5, np.int64))
    module.nan_x = lambda num_clients, seed: (np.full((6, 2), np.nan), np.array([0, 1] * 3))
    module.bad_owner = lambda num_clients, seed: (np.zeros((6, 2)), np.array([0, 1] * 3), np.full(6, num_clients))
    module.one_class = lambda num_clients, seed: (np.zeros((6, 2)), np.zeros(6, np.int64))
    module.batchnorm = lambda num_features, num_classes: nn.Sequential(nn.Linear(num_features, num_classes),
                                                                       nn.BatchNorm1d(num_classes))
    sys.modules[module.__name__] = module
    yield module.__name__
    del sys.modules[module.__name__]


def test_malformed_targets_are_refused_with_a_reason(plugin_module):
    with pytest.raises(ConfigError, match="package.module:loader"):
        DataSpec(dataset="no-colon-here")
    with pytest.raises(PluginError, match="must be package.module:name"):
        load_object("module_only:", "--model")
    with pytest.raises(PluginError, match="cannot import"):
        load_object("no_such_package_xyz.mod:f", "--model")
    with pytest.raises(PluginError, match="has no attribute 'missing'"):
        load_object(f"{plugin_module}:missing", "--model")
    with pytest.raises(PluginError, match="not a callable"):
        load_object(f"{plugin_module}:constant", "--model")
    with pytest.raises(PluginError, match="not a torch nn.Module"):
        init_weights(4, 2, 0, seed=0, model=f"{plugin_module}:not_a_module")
    with pytest.raises(PluginError, match="non-float state"):
        init_weights(4, 2, 0, seed=0, model=f"{plugin_module}:batchnorm")
    for name, words in [("bad_shapes", "x must be"), ("nan_x", "finite"), ("bad_owner", "client_of"),
                        ("one_class", "at least 2 classes")]:
        with pytest.raises(PluginError, match=words):
            load_dataset(f"{plugin_module}:{name}", num_clients=3, seed=0)
