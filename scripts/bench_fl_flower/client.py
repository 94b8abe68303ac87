"""Flower peer client: trains the same MLP with the same local-training code as fl-client, on the same
per-client folder (`fl-server partition`'s client-K, read by the same loader as `fl-client --data`) scaled the
same way (the server root set's mean and std)."""
from __future__ import annotations

import sys

import flwr as fl
import torch  # noqa: F401 (imported before single_threaded() so it applies to torch too)

from mlsyskit.core.sim import sub_seed
from mlsyskit.tools.fl.config import TrainSpec
from mlsyskit.tools.fl.local_data import load_client_data, load_server_data
from mlsyskit.tools.fl.threads import single_threaded
from mlsyskit.tools.fl.training import train_local

address, folder, cid, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
num_features, num_classes, server_dir = int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
single_threaded()  # the same thread policy as fl-client
# scaled as fl-client scales its data: with the server's root-set statistics (fl-server sends them with the task;
# here they are read from the server's folder once, before the first round)
scaling = load_server_data(server_dir, input_scaling="standardize").input_scaling
data = scaling.applied_to(load_client_data(folder, cid))
spec = TrainSpec(epochs=epochs)
NAMES = ["0.weight", "0.bias", "2.weight", "2.bias"]


class DigitsClient(fl.client.NumPyClient):
    def fit(self, parameters, config):
        seed = sub_seed(0, f"train:{config['round']}:{cid}") % (2**31)
        result = train_local(dict(zip(NAMES, parameters, strict=True)), data, spec, num_features, num_classes, seed)
        return list(result.weights.values()), result.num_samples, {
            "quality": result.quality, "cpu_time_s": result.cpu_time_s, "train_time_s": result.train_time_s}

    def evaluate(self, parameters, config):
        return 0.0, 1, {}


fl.client.start_client(server_address=address, client=DigitsClient().to_client(), insecure=True)
