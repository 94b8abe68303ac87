"""A user's own model and data over the real transport: clients build the model named by the job,
announce its shapes at join, train it and evaluate the final model with it; a client whose model
differs is refused at registration."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from mlsyskit.core.rpc import RpcClient, RpcError
from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.client import FlClient
from mlsyskit.tools.fl.config import DataSpec, JobConfig, TrainSpec
from mlsyskit.tools.fl.server import FlServer

pytestmark = pytest.mark.slow  # starts a server (listens on a socket) or a process


def own(config, cid):
    """Client cid's own data in this experiment (a real client loads its --data; tests split one dataset)."""
    from mlsyskit.tools.fl.data import load_client

    return load_client(config.data, cid)[0]

pytest.importorskip("torch")

CNN = "mlsyskit.tools.fl.examples.digits_cnn:small_cnn"
LOADER = "mlsyskit.tools.fl.examples.digits_cnn:digits_two_labels_per_client"


def test_custom_model_and_dataset_run_end_to_end_and_wrong_shapes_are_refused(tmp_path):
    config = JobConfig(strategy="fedavg", rounds=2, per_round=2, seed=1, round_timeout_s=120.0, min_clients=2,
                       train=TrainSpec(model=CNN, epochs=1, local_only_epochs=1),
                       data=DataSpec(dataset=LOADER, num_clients=2, seed=1))

    async def main():
        server = FlServer(config, MetaStore(tmp_path / "fl.db"), eval_timeout_s=60.0)
        port = await server.start()
        address = f"127.0.0.1:{port}"
        try:
            async with RpcClient(address) as rpc:  # an MLP's shapes where the job trains the CNN
                wrong = {"0.weight": [64, 64], "0.bias": [64], "2.weight": [10, 64], "2.bias": [10]}
                with pytest.raises(RpcError, match="model differs"):
                    async for _ in rpc.stream("join", {"client_id": 0, "num_samples": 10, "local_only_accuracy": 0.5,
                                                        "shapes": wrong}, timeout=30):
                        break
            summaries = await asyncio.gather(server.serve(registration_timeout_s=60),
                                             *(FlClient(address, cid, own(config, cid)).run() for cid in range(2)))
        finally:
            await server.stop()
        return server, summaries[1:]

    server, summaries = asyncio.run(main())
    assert all(s.done and s.evaluated for s in summaries)
    assert any(s.accepted > 0 for s in summaries)
    # the global model is the CNN's (conv layers), never the built-in MLP
    assert any(np.asarray(w).ndim == 4 for w in server.coordinator.weights.values())
