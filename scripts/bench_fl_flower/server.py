"""Flower peer for scripts/bench_fl_transport.py: the same FedAvg job (digits MLP, all clients every
round, central evaluation on the same test set) on flwr's gRPC server (`start_server`, the lowest-latency
way Flower runs a job over the network: one bidirectional stream per client, no SuperLink polling).

Runs inside the bench venv (.bench-venvs/flwr), which also sees mlsyskit's venv for the data and
model code. Writes the monotonic time of each round's start (configure_fit) and end (after
aggregate_fit and evaluation) to the JSON file given as the last argument, with the same per-phase
wall times fl-server logs (collect: configure_fit until all fit results are in; aggregate; evaluate),
the clients' training CPU (their cpu_time_s from train_local) and each client's training wall time
(train_time_s), so the bench can take the slowest client's training out of each round.
"""
from __future__ import annotations

import json
import sys
import time

import flwr as fl
from flwr.common import ndarrays_to_parameters
from flwr.server.strategy import FedAvg

from mlsyskit.core.sim import sub_seed
from mlsyskit.tools.fl.config import TrainSpec
from mlsyskit.tools.fl.local_data import load_server_data
from mlsyskit.tools.fl.model import evaluate, init_weights
from mlsyskit.tools.fl.threads import single_threaded

address, server_dir, clients, rounds, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
single_threaded()  # the same thread policy as fl-server
data = load_server_data(server_dir, input_scaling="standardize")  # as fl-server run: the root set's statistics
initial = init_weights(data.num_features, data.num_classes, TrainSpec().hidden, sub_seed(0, "model-init"))
names = list(initial)
marks: dict[str, dict[int, float]] = {"start": {}, "end": {}}
phases: dict[int, dict[str, float]] = {}
training_cpu: dict[int, float] = {}
train_time: dict[int, list[float]] = {}


def central_evaluation(server_round, parameters, config):
    begin = time.monotonic()
    metrics = evaluate(dict(zip(names, parameters, strict=True)), data.x_test, data.y_test)
    if server_round > 0:
        marks["end"][server_round] = time.monotonic()
        phases[server_round]["evaluate_s"] = marks["end"][server_round] - begin
    return metrics["loss"], {"accuracy": metrics["accuracy"]}


class TimedFedAvg(FedAvg):
    def configure_fit(self, server_round, parameters, client_manager):
        marks["start"][server_round] = time.monotonic()
        return super().configure_fit(server_round, parameters, client_manager)

    def aggregate_fit(self, server_round, results, failures):
        collected = time.monotonic()
        training_cpu[server_round] = sum(fit.metrics["cpu_time_s"] for _, fit in results)
        train_time[server_round] = [fit.metrics["train_time_s"] for _, fit in results]
        aggregated = super().aggregate_fit(server_round, results, failures)
        phases[server_round] = {"collect_s": collected - marks["start"][server_round],
                                "aggregate_s": time.monotonic() - collected}
        return aggregated


strategy = TimedFedAvg(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=clients,
                       min_available_clients=clients, min_evaluate_clients=0, evaluate_fn=central_evaluation,
                       initial_parameters=ndarrays_to_parameters(list(initial.values())),
                       on_fit_config_fn=lambda rnd: {"round": rnd})
history = fl.server.start_server(server_address=address, config=fl.server.ServerConfig(num_rounds=rounds),
                                 strategy=strategy)
accuracy = history.metrics_centralized.get("accuracy", [])
with open(out, "w") as f:
    json.dump({"start": marks["start"], "end": marks["end"], "phases": phases, "training_cpu": training_cpu,
               "train_time": train_time, "accuracy": accuracy[-1][1] if accuracy else None}, f)
