"""Flower peer client: trains the same MLP with the same local-training code as fl-client."""
from __future__ import annotations

import sys

import flwr as fl
import torch  # noqa: F401 (imported before single_threaded() so it applies to torch too)

from mlsyskit.core.sim import sub_seed
from mlsyskit.tools.fl.config import DataSpec, TrainSpec
from mlsyskit.tools.fl.data import load_client
from mlsyskit.tools.fl.threads import single_threaded
from mlsyskit.tools.fl.training import train_local

address, clients, cid, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
single_threaded()  # the same thread policy as fl-client
data, num_features, num_classes = load_client(DataSpec(dataset="digits", num_clients=clients, seed=0), cid)
spec = TrainSpec(epochs=epochs)
NAMES = ["0.weight", "0.bias", "2.weight", "2.bias"]


class DigitsClient(fl.client.NumPyClient):
    def fit(self, parameters, config):
        seed = sub_seed(0, f"train:{config['round']}:{cid}") % (2**31)
        result = train_local(dict(zip(NAMES, parameters, strict=True)), data, spec, num_features, num_classes, seed)
        return list(result.weights.values()), result.num_samples, {"quality": result.quality,
                                                                     "cpu_time_s": result.cpu_time_s}

    def evaluate(self, parameters, config):
        return 0.0, 1, {}


fl.client.start_client(server_address=address, client=DigitsClient().to_client(), insecure=True)
