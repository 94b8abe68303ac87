"""One identity per client: with mutual TLS (`fl-server certs`) a caller is the client its certificate
names. Attacks measured here: impersonation on every method, the shared token without a certificate,
replayed updates (own and another client's), final-accuracy reports from another id, unasked, twice
or out of [0, 1], and an update whose consumer_accuracy is out of range."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from mlsyskit.core.rpc import ClientTls, RpcClient, RpcError, ServerTls, StatusCode
from mlsyskit.core.rpc_tls import issue_certs
from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.client import ClientStopped, FlClient
from mlsyskit.tools.fl.config import DataSpec, JobConfig
from mlsyskit.tools.fl.incentive.ledger import client_account

pytestmark = pytest.mark.slow  # starts a server (listens on a socket) or a process


def own(config, cid):
    """Client cid's own data in this experiment (a real client loads its --data; tests split one dataset)."""
    from mlsyskit.tools.fl.data import load_client

    return load_client(config.data, cid)[0]

METRICS = {"num_samples": 0, "loss": 0.5, "quality": 0.9, "train_time_s": 0.1, "cpu_time_s": 0.1}


def tls_for(files, cid) -> ClientTls:
    return ClientTls.from_files(files.ca, *files.client(cid))


async def expect_code(coro, code: StatusCode) -> str:
    with pytest.raises(RpcError) as info:
        await coro
    assert info.value.code == code, info.value
    return info.value.message


async def attacker(address: str, files, log: dict) -> None:
    """Client 2 with its own certificate: tries to be client 0, replays client 0's update, lies in reports."""
    async with RpcClient(address, token="t", tls=tls_for(files, "2")) as rpc:
        log["session_as_0"] = await expect_code(
            _session_hello(rpc, {"client_id": 0, "num_samples": 1, "local_only_accuracy": 0.5}),
            StatusCode.PERMISSION_DENIED)
        log["join_as_0"] = await expect_code(
            _drain(rpc.stream("join", {"client_id": 0, "num_samples": 1, "local_only_accuracy": 0.5})),
            StatusCode.PERMISSION_DENIED)
        session = rpc.bidi("session", timeout=120)
        await session.send({"client_id": 2, "num_samples": 1, "local_only_accuracy": 0.5})
        async for task in session:
            if task["type"] == "train":
                await asyncio.wait_for(log["tapped"].wait(), 30)  # client 0 has sent its update
                captured = log["captured"]  # client 0's update, replayed as client 0
                log.setdefault("replay_as_0", await expect_code(
                    rpc.call("submit", dict(captured, round=task["round"])), StatusCode.PERMISSION_DENIED))
                lie = dict(captured["metrics"], num_samples=log["partition_2"], consumer_accuracy=1.7)
                await session.send({"client_id": 2, "round": task["round"], "weights": captured["weights"],
                                    "metrics": lie})
            elif task["type"] == "receipt":
                log.setdefault("lie_receipt", task)
            elif task["type"] == "evaluate":
                log["eval_as_0"] = await expect_code(rpc.call("evaluate", {"client_id": 0, "accuracy": 0.1}),
                                                     StatusCode.PERMISSION_DENIED)
                log["eval_nan"] = await expect_code(rpc.call("evaluate", {"client_id": 2, "accuracy": float("nan")}),
                                                    StatusCode.INVALID_ARGUMENT)
                log["eval_big"] = await expect_code(rpc.call("evaluate", {"client_id": 2, "accuracy": 3.0}),
                                                    StatusCode.INVALID_ARGUMENT)
                await rpc.call("evaluate", {"client_id": 2, "accuracy": 0.5})
                log["eval_twice"] = await expect_code(rpc.call("evaluate", {"client_id": 2, "accuracy": 0.9}),
                                                      StatusCode.ALREADY_EXISTS)
            elif task["type"] == "done":
                session.cancel()
                return


async def _session_hello(rpc: RpcClient, hello: dict) -> None:
    session = rpc.bidi("session", timeout=30)
    try:
        await session.send(hello)
        async for _ in session:
            pass
    finally:
        session.cancel()


async def _drain(stream) -> None:
    async for _ in stream:
        pass


class Capturing(FlClient):
    """Honest client 0 that also hands its first update to the attacker (as a network tap would) and
    sends that same update twice itself (a replay within the round)."""

    def __init__(self, *args, log: dict, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.log = log

    def _train(self, task):
        update = super()._train(task)
        self.log.setdefault("captured", update)
        self.log["tapped"].set()
        return update


def test_certificates_bind_ids_replays_and_reports_are_refused(tmp_path):
    files = issue_certs(tmp_path / "certs", client_ids=["0", "1", "2"])
    config = JobConfig(strategy="fedavg", rounds=2, per_round=3, min_clients=3, round_timeout_s=30.0,
                       data=DataSpec(num_clients=3))
    tls = ServerTls.from_files(files.server_cert, files.server_key, client_ca=files.ca)
    log: dict = {}

    async def main():
        from mlsyskit.tools.fl.data import load_federated
        from mlsyskit.tools.fl.server import FlServer

        log["partition_2"] = load_federated(config.data).clients[2].num_samples
        log["tapped"] = asyncio.Event()
        store = MetaStore(tmp_path / "fl.db")
        server = FlServer(config, store, token="t", tls=tls, eval_timeout_s=20.0)
        port = await server.start()
        address = f"localhost:{port}"
        try:
            # the shared token without a certificate gets no connection at all
            async with RpcClient(address, token="t", tls=ClientTls.from_files(files.ca)) as rpc:
                await expect_code(rpc.call("job", {}, timeout=5), StatusCode.UNAVAILABLE)
            # ... and a client in that position is told what it lacks, not "no server answered"
            with pytest.raises(ClientStopped, match="asks for a client certificate"):
                await FlClient(address, 0, own(config, 0), token="t", tls=ClientTls.from_files(files.ca),
                               reconnect_s=10).run()
            with pytest.raises(ClientStopped, match="expects TLS and this client sent plaintext: give --certs"):
                await FlClient(address, 0, own(config, 0), token="t", reconnect_s=10).run()
            # a whole client run as someone else stops at once with the server's reason
            with pytest.raises(ClientStopped, match="certificate is for client 1"):
                await FlClient(address, 0, own(config, 0), token="t", tls=tls_for(files, "1"), reconnect_s=10).run()
            serving = asyncio.create_task(server.serve(registration_timeout_s=60))
            honest0 = Capturing(address, 0, own(config, 0), token="t", tls=tls_for(files, "0"), log=log)
            honest1 = FlClient(address, 1, own(config, 1), token="t", tls=tls_for(files, "1"))
            results = await asyncio.gather(honest0.run(), honest1.run(), attacker(address, files, log), serving)
        finally:
            await server.stop()
        return server, store, results

    server, store, results = asyncio.run(asyncio.wait_for(main(), 120))
    try:
        assert "it cannot act as client 0" in log["session_as_0"] and "certificate is for client 2" in log["join_as_0"]
        assert "cannot act as client 0" in log["replay_as_0"] and "cannot act as client 0" in log["eval_as_0"]
        assert "outside [0, 1]" in log["eval_nan"] and "outside [0, 1]" in log["eval_big"]
        assert "already reported" in log["eval_twice"]
        receipt = log["lie_receipt"]
        assert receipt["accepted"] is False and "consumer_accuracy 1.7 is outside [0, 1]" in receipt["reason"]
        for outcome in server.outcomes:
            assert outcome.reports[0].status == "valid" and outcome.reports[1].status == "valid"
            assert outcome.reports[2].status == "rejected"
        pay = server.coordinator.ledger.totals_by("pay")
        assert client_account(2) not in pay and pay[client_account(0)] > 0
        # the attacker's refused final-accuracy reports never reached the books; its one in-range report did
        assert server.coordinator.consumer_accuracy[2] == 0.5
        summary0 = results[0]
        assert summary0.done and summary0.accepted == 2 and summary0.rejected == 0 and summary0.tokens_earned > 0
    finally:
        store.close()


def test_replayed_update_in_the_same_or_a_later_round_is_refused(tmp_path):
    """Without mutual TLS too: an update sent twice in a round counts once; an old round's update is refused.
    Client 2 holds round 1 open until the replayer has both receipts, so the copy meets an open round whatever
    the machine's load (without it, the round could close between the two messages)."""
    config = JobConfig(strategy="fedavg", rounds=2, per_round=3, min_clients=3, round_timeout_s=6.0,
                       data=DataSpec(num_clients=3))
    both_receipts = asyncio.Event()

    async def holder(address: str) -> None:
        from mlsyskit.tools.fl.data import load_federated

        samples = load_federated(config.data).clients[2].num_samples
        async with RpcClient(address) as rpc:
            session = rpc.bidi("session", timeout=60)
            await session.send({"client_id": 2, "num_samples": samples, "local_only_accuracy": 0.5})
            async for task in session:
                if task["type"] == "train":
                    if task["round"] == 1:
                        await both_receipts.wait()
                    weights = {k: np.asarray(v) + np.float32(0.001) for k, v in task["weights"].items()}
                    await session.send({"client_id": 2, "round": task["round"], "weights": weights,
                                        "metrics": dict(METRICS, num_samples=samples)})
                elif task["type"] == "evaluate":
                    await rpc.call("evaluate", {"client_id": 2, "accuracy": 0.5})
                elif task["type"] == "done":
                    session.cancel()
                    return

    async def replayer(address: str, log: list) -> None:
        async with RpcClient(address) as rpc:
            session = rpc.bidi("session", timeout=60)
            await session.send({"client_id": 1, "num_samples": 1, "local_only_accuracy": 0.5})
            from mlsyskit.tools.fl.data import load_federated

            samples = load_federated(config.data).clients[1].num_samples
            first = None
            async for task in session:
                if task["type"] == "train":
                    weights = {k: np.asarray(v) + np.float32(0.001) for k, v in task["weights"].items()}
                    update = {"client_id": 1, "round": task["round"], "weights": weights,
                              "metrics": dict(METRICS, num_samples=samples)}
                    if first is None:
                        first = update
                        await session.send(update)
                        await session.send(update)  # the same message again
                    else:
                        await session.send(first)  # round 1's update in round 2
                elif task["type"] == "receipt":
                    log.append(task)
                    if len(log) == 2:
                        both_receipts.set()
                elif task["type"] == "evaluate":
                    await rpc.call("evaluate", {"client_id": 1, "accuracy": 0.5})
                elif task["type"] == "done":
                    session.cancel()
                    return

    async def main():
        from mlsyskit.tools.fl.server import FlServer

        store = MetaStore(tmp_path / "fl.db")
        server = FlServer(config, store, eval_timeout_s=10.0)
        port = await server.start()
        log: list = []
        try:
            await asyncio.gather(server.serve(60), FlClient(f"127.0.0.1:{port}", 0, own(config, 0)).run(),
                                 replayer(f"127.0.0.1:{port}", log), holder(f"127.0.0.1:{port}"))
        finally:
            await server.stop()
        store.close()
        return server, log

    server, log = asyncio.run(asyncio.wait_for(main(), 120))
    assert [r["accepted"] for r in log] == [True, False, False]
    assert "already reported in round 1" in log[1]["reason"] and "round 1 is not open" in log[2]["reason"]
    r1, r2 = server.outcomes
    assert r1.reports[1].status == "valid"  # the first copy stands
    assert r2.reports[1].status == "failed"  # a stale update is no update
