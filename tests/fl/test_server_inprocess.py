"""The gRPC server in-process: bad updates are rejected and unpaid, silent clients hit the deadline,
garbage and oversized payloads do not hurt the server, a wrong token is refused."""
from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

from mlsyskit.core.rpc import DEFAULT_MAX_MESSAGE_BYTES, RpcClient, RpcError, StatusCode
from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.client import ClientStopped, FlClient
from mlsyskit.tools.fl.config import DataSpec, JobConfig
from mlsyskit.tools.fl.incentive.ledger import client_account
from mlsyskit.tools.fl.server import FlServer
from mlsyskit.tools.fl.server_wire import transport_limit

pytestmark = pytest.mark.slow  # starts a server (listens on a socket) or a process


def own(config, cid):
    """Client cid's own data in this experiment (a real client loads its --data; tests split one dataset)."""
    from mlsyskit.tools.fl.data import load_client

    return load_client(config.data, cid)[0]

METRICS = {"num_samples": 10, "loss": 0.5, "quality": 0.9, "train_time_s": 0.1, "cpu_time_s": 0.1}


async def misbehave(address: str, log: list) -> None:
    """Client 2: oversized + garbage + NaN in round 1, wrong shapes in round 2, silence in round 3."""
    import grpc

    async with RpcClient(address, token="t") as rpc:
        async for task in rpc.stream("join", {"client_id": 2, "num_samples": 10, "local_only_accuracy": 0.5},
                                     timeout=None):
            if task["type"] == "train" and task["round"] == 1:
                huge = {k: np.zeros(400_000, np.float32) for k in task["weights"]}
                with pytest.raises(RpcError) as info:
                    await rpc.call("submit", {"client_id": 2, "round": 1, "weights": huge, "metrics": METRICS})
                log.append(info.value.code)
                async with grpc.aio.insecure_channel(address) as channel:
                    with pytest.raises(grpc.aio.AioRpcError) as raw:
                        await channel.unary_unary("/mlsyskit/submit")(
                            b"\x93garbage", metadata=(("authorization", "Bearer t"),), timeout=5)
                    log.append(raw.value.code())
                nan = {k: np.full_like(v, np.nan) for k, v in task["weights"].items()}
                log.append(await rpc.call("submit", {"client_id": 2, "round": 1, "weights": nan, "metrics": METRICS}))
            elif task["type"] == "train" and task["round"] == 2:
                bad = {k: np.zeros(v.shape[::-1] + (1,), v.dtype) for k, v in task["weights"].items()}
                log.append(await rpc.call("submit", {"client_id": 2, "round": 2, "weights": bad, "metrics": METRICS}))
            elif task["type"] == "evaluate":
                await rpc.call("evaluate", {"client_id": 2, "accuracy": 0.5})
            elif task["type"] == "done":
                return


def test_bad_updates_deadline_and_auth(tmp_path):
    # 8 s: the bad updates must arrive before the deadline on a loaded machine; round 3's silence waits it out
    config = JobConfig(strategy="tiff", rounds=3, per_round=3, round_timeout_s=8.0, data=DataSpec(num_clients=3))

    async def main():
        store = MetaStore(tmp_path / "fl.db")
        server = FlServer(config, store, token="t", max_message_bytes=1 << 20, eval_timeout_s=5.0)
        port = await server.start()
        address = f"127.0.0.1:{port}"
        try:
            with pytest.raises(ClientStopped, match="bad or missing token"):
                await FlClient(address, 0, own(config, 0), token="wrong", reconnect_s=5).run()
            async with RpcClient(address, token="t") as rpc:
                with pytest.raises(RpcError, match="outside 0..2") as info:
                    _ = [m async for m in rpc.stream("join", {"client_id": 7, "num_samples": 1,
                                                              "local_only_accuracy": 0.1})]
                assert info.value.code == StatusCode.INVALID_ARGUMENT
            serving = asyncio.create_task(server.serve(registration_timeout_s=60))
            log: list = []
            honest = [asyncio.create_task(FlClient(address, i, own(config, i), token="t").run()) for i in (0, 1)]
            await asyncio.gather(misbehave(address, log), *honest, serving)
        finally:
            await server.stop()
        return server, log, store

    server, log, store = asyncio.run(asyncio.wait_for(main(), 120))
    assert log[0] == StatusCode.RESOURCE_EXHAUSTED and log[1] == StatusCode.INVALID_ARGUMENT
    assert log[2]["accepted"] is False and "NaN" in log[2]["reason"]
    assert log[3]["accepted"] is False and "shape" in log[3]["reason"]
    r1, r2, r3 = server.outcomes
    assert r1.reports[2].status == "rejected" and "NaN" in r1.reports[2].reason
    assert r2.reports[2].status == "rejected" and "shape" in r2.reports[2].reason
    assert r3.reports[2].status == "failed" and "deadline" in r3.reports[2].reason
    assert r3.duration_s >= 3.0  # round 3 waited for the deadline
    assert all(r.reports[c].status == "valid" for r in server.outcomes for c in (0, 1))
    ledger = server.coordinator.ledger
    pay = ledger.totals_by("pay")
    assert client_account(2) not in pay and pay[client_account(0)] > 0 and pay[client_account(1)] > 0
    assert abs(ledger.total()) < 1e-9
    store.close()


def test_update_over_the_job_limit_but_under_the_transport_limit_is_rejected_with_a_reason(tmp_path, caplog):
    """The transport limit derives from the job's max_update_bytes (2x + an envelope), so an update larger
    than core.rpc's 64 MiB default but over the job's limit reaches validation: a receipt with the reason,
    a logged, unpaid rejection, not a lost connection. The honest client's round goes on."""
    limit = 40 << 20
    config = JobConfig(rounds=1, per_round=2, round_timeout_s=60.0, max_update_bytes=limit,
                       data=DataSpec(num_clients=2))
    assert transport_limit(config) == 2 * limit + (1 << 20) > DEFAULT_MAX_MESSAGE_BYTES
    oversized = 72 << 20  # > the job's limit and > the old fixed 64 MiB transport limit, < the derived one

    async def send_oversized(address: str) -> dict:
        async with RpcClient(address, max_message_bytes=128 << 20) as rpc:
            async for task in rpc.stream("join", {"client_id": 1, "num_samples": 10, "local_only_accuracy": 0.5},
                                         timeout=None):
                if task["type"] == "train":
                    names = sorted(task["weights"])
                    huge = {k: np.zeros(oversized // 4 // len(names), np.float32) for k in names}
                    reply = await rpc.call("submit", {"client_id": 1, "round": 1, "weights": huge,
                                                      "metrics": METRICS}, timeout=60)
                    del huge
                elif task["type"] == "evaluate":
                    await rpc.call("evaluate", {"client_id": 1, "accuracy": 0.5})
                elif task["type"] == "done":
                    return reply

    async def main():
        store = MetaStore(tmp_path / "fl.db")
        server = FlServer(config, store, eval_timeout_s=10.0)
        assert server.max_message_bytes == transport_limit(config)
        port = await server.start()
        address = f"127.0.0.1:{port}"
        try:
            serving = asyncio.create_task(server.serve(registration_timeout_s=60))
            reply, _, _ = await asyncio.gather(send_oversized(address), FlClient(address, 0, own(config, 0)).run(),
                                               serving)
        finally:
            await server.stop()
        return server, reply, store

    caplog.set_level(logging.WARNING, logger="mlsyskit.fl.server")
    server, reply, store = asyncio.run(asyncio.wait_for(main(), 120))
    assert reply["accepted"] is False and f"exceeds the {limit}-byte limit" in reply["reason"]
    (outcome,) = server.outcomes
    assert outcome.reports[1].status == "rejected" and "exceeds" in outcome.reports[1].reason
    assert outcome.reports[0].status == "valid"
    assert any("rejected update from client 1" in m and "exceeds" in m for m in caplog.messages)
    pay = server.coordinator.ledger.totals_by("pay")
    assert client_account(1) not in pay and pay[client_account(0)] > 0
    store.close()


def test_session_messages_claiming_another_client_end_only_that_session(tmp_path):
    """On the bidirectional `session`, an update for another client id or undecodable bytes end that
    client's session (INVALID_ARGUMENT, counted as failed, unpaid); the other client's round goes on."""
    import grpc

    config = JobConfig(rounds=1, per_round=2, round_timeout_s=30.0, data=DataSpec(num_clients=2))

    async def spoof(address: str) -> list:
        codes = []
        async with RpcClient(address) as rpc:
            session = rpc.bidi("session", timeout=30)
            await session.send({"client_id": 1, "num_samples": 10, "local_only_accuracy": 0.5})
            with pytest.raises(RpcError) as info:
                async for task in session:
                    if task["type"] == "train":
                        await session.send({"client_id": 0, "round": task["round"], "weights": task["weights"],
                                            "metrics": METRICS})
            codes.append(info.value.code)
        async with grpc.aio.insecure_channel(address) as channel:  # rejoins, then sends garbage
            call = channel.stream_stream("/mlsyskit/session")()
            await call.write(b"\x93garbage")
            with pytest.raises(grpc.aio.AioRpcError) as raw:
                await call.read()
            codes.append(raw.value.code())
        return codes

    async def main():
        store = MetaStore(tmp_path / "fl.db")
        server = FlServer(config, store, eval_timeout_s=2.0)
        port = await server.start()
        address = f"127.0.0.1:{port}"
        try:
            serving = asyncio.create_task(server.serve(registration_timeout_s=30))
            codes, honest, _ = await asyncio.gather(spoof(address), FlClient(address, 0, own(config, 0)).run(),
                                                    serving)
        finally:
            await server.stop()
        store.close()
        return server, codes, honest

    server, codes, honest = asyncio.run(asyncio.wait_for(main(), 60))
    assert codes == [StatusCode.INVALID_ARGUMENT, StatusCode.INVALID_ARGUMENT]
    (outcome,) = server.outcomes
    assert outcome.reports[0].status == "valid" and honest.rounds_trained == 1
    assert outcome.reports[1].status == "failed"


def test_real_transport_and_simulation_give_the_same_job(tmp_path):
    """Same seed, same job: the gRPC server with real clients and the virtual-clock simulator select the
    same clients, reach the same accuracy and write the same ledger (they differ only in transport)."""
    from mlsyskit.tools.fl.simulator import Simulation

    config = JobConfig(strategy="tiff", rounds=3, per_round=2, seed=4, round_timeout_s=60.0, min_clients=4,
                       data=DataSpec(num_clients=4, seed=4))
    attacks = {1: "label-flip"}

    async def real():
        store = MetaStore(tmp_path / "real.db")
        server = FlServer(config, store, eval_timeout_s=30.0)
        port = await server.start()
        address = f"127.0.0.1:{port}"
        try:
            clients = [FlClient(address, cid, own(config, cid), attack=attacks.get(cid, "none")).run()
                       for cid in range(4)]
            await asyncio.gather(server.serve(registration_timeout_s=60), *clients)
        finally:
            await server.stop()
        return server, store

    server, real_store = asyncio.run(asyncio.wait_for(real(), 120))
    with MetaStore(tmp_path / "sim.db") as sim_store:
        sim = Simulation(config, sim_store, attacks)
        sim.run()
        assert [o.selected for o in server.outcomes] == [o.selected for o in sim.result.outcomes]
        assert [o.global_metrics for o in server.outcomes] == [o.global_metrics for o in sim.result.outcomes]
        # the same verdict for every update on both sides (the label-flipper's refused by TIFF's verification)
        verdicts = [[{c: (r.status, r.reason, r.aggregated) for c, r in o.reports.items()} for o in outcomes]
                    for outcomes in (server.outcomes, sim.result.outcomes)]
        assert verdicts[0] == verdicts[1]
        assert any(status == "valid" for o in verdicts[1] for status, _, _ in o.values())
        real_rows, sim_rows = (sorted(r[1:] for r in s.coordinator.ledger.rows()) for s in (server, sim))
        assert [r[:3] + r[4:] for r in real_rows] == [r[:3] + r[4:] for r in sim_rows]  # clients join in any order
        assert [r[3] for r in real_rows] == pytest.approx([r[3] for r in sim_rows], abs=1e-12)
        # the final reimbursement ran on both sides, with the same refunds (TIFF's earned pot may refund nothing)
        reimbursed = [[(c, v["refund"]) for _, rec in st.read_log("fl_reimbursements")
                       for c, v in sorted(rec["consumers"].items())] for st in (real_store, sim_store)]
        assert [c for c, _ in reimbursed[0]] == [c for c, _ in reimbursed[1]] == ["0", "1", "2", "3"]
        assert [v for _, v in reimbursed[0]] == pytest.approx([v for _, v in reimbursed[1]], abs=1e-12)
    real_store.close()


def test_a_reconnect_mid_round_drops_the_old_stream_at_once(tmp_path):
    """Client 1 is selected, then its session breaks and it opens a new one (as after a lost connection)
    before reporting: the round marks it failed at once instead of waiting for its 60 s deadline, and goes on
    with client 0. While the old session was live, a second one was refused (one session per client id)."""
    config = JobConfig(strategy="fedavg", rounds=1, per_round=2, min_clients=2, round_timeout_s=60.0,
                       data=DataSpec(num_clients=2))
    refused = []

    async def flaky(address: str, server) -> None:
        hello = {"client_id": 1, "num_samples": 10, "local_only_accuracy": 0.5}
        async with RpcClient(address) as rpc:
            first = rpc.bidi("session", timeout=60)
            await first.send(hello)
            async for task in first:
                if task["type"] == "train":
                    break  # selected; now "reconnect" without reporting
            concurrent = rpc.bidi("session", timeout=60)  # the first is alive (busy with its task): refused
            await concurrent.send(hello)
            with pytest.raises(RpcError) as info:
                async for _ in concurrent:
                    pass
            refused.append(info.value.code)
            first.cancel()  # the connection is lost ...
            while 1 in server._queues:  # ... and the server sees it go
                await asyncio.sleep(0.01)  # polling the server's state for a condition
            second = rpc.bidi("session", timeout=60)
            await second.send(hello)
            async for task in second:
                if task["type"] == "evaluate":
                    await rpc.call("evaluate", {"client_id": 1, "accuracy": 0.5})
                elif task["type"] == "done":
                    break
            first.cancel()
            second.cancel()

    async def main():
        store = MetaStore(tmp_path / "fl.db")
        server = FlServer(config, store, eval_timeout_s=10.0)
        port = await server.start()
        address = f"127.0.0.1:{port}"
        try:
            await asyncio.gather(server.serve(registration_timeout_s=30), flaky(address, server),
                                 FlClient(address, 0, own(config, 0)).run())
        finally:
            await server.stop()
        store.close()
        return server

    server = asyncio.run(asyncio.wait_for(main(), 50))
    (outcome,) = server.outcomes
    assert refused == [StatusCode.ALREADY_EXISTS]
    assert outcome.reports[1].status == "failed" and "connection lost" in outcome.reports[1].reason
    assert outcome.reports[0].status == "valid"
    assert outcome.duration_s < 30  # did not wait for the 60 s deadline


def test_a_server_that_breaks_every_session_does_not_keep_a_client_retrying_forever():
    """A server that answers `job` but fails every session (a bug, answered as INTERNAL) looks like a transport
    failure; the client retries, but gives up after MAX_BARREN_SESSIONS such sessions in a row, with the reason."""
    from mlsyskit.core.rpc import RpcServer
    from mlsyskit.tools.fl.client import MAX_BARREN_SESSIONS

    config = JobConfig(per_round=2, data=DataSpec(num_clients=2))
    opened = []

    async def main():
        server = RpcServer()

        async def job(payload, call):
            return {"task": {"num_features": 64, "num_classes": 10}, "train": config.to_dict()["train"],
                    "strategy": "fedavg", "rounds": 1, "seed": 0}

        async def session(requests, call):
            await anext(requests)
            opened.append(1)
            yield {"type": "welcome", "round": 0}
            raise ValueError("a bug in the session handler")

        server.unary("job", job)
        server.bidi("session", session)
        port = await server.start()
        try:
            client = FlClient(f"127.0.0.1:{port}", 0, own(config, 0), backoff_initial_s=0.01, backoff_max_s=0.02,
                              reconnect_s=60)
            with pytest.raises(ClientStopped, match="each failed before any task.*a bug in the session handler"):
                await client.run()
        finally:
            await server.stop()

    asyncio.run(asyncio.wait_for(main(), 60))
    assert len(opened) == MAX_BARREN_SESSIONS


def test_tiff_gated_scheduler_over_grpc_resumes_with_its_memory_and_refuses_another_scheduler(tmp_path):
    """`--strategy tiff --scheduler adaptive` on the real server: TIFF's trust gates the scheduler, every round_end
    event names the scheduler's tiers, and a restart from the run directory resumes the scheduler's memory; a
    restart with another scheduler is refused (its memory would not fit)."""
    import json

    from mlsyskit.core.telemetry import Telemetry
    from mlsyskit.tools.fl.coordinator import JobMismatch
    from mlsyskit.tools.fl.scheduling.gated import GatedScheduler

    config = JobConfig(strategy="tiff", scheduler="adaptive", rounds=2, per_round=3, min_clients=3,
                       round_timeout_s=30.0, data=DataSpec(num_clients=3))

    async def main():
        store = MetaStore(tmp_path / "fl.db")
        telemetry = Telemetry(log_path=tmp_path / "events.jsonl")
        server = FlServer(config, store, telemetry=telemetry, eval_timeout_s=10.0, heartbeat_s=0.5)
        port = await server.start()
        try:
            await asyncio.gather(server.serve(60),
                                 *(FlClient(f"127.0.0.1:{port}", cid, own(config, cid)).run() for cid in range(3)))
        finally:
            await server.stop()
            telemetry.close()
        return server, store

    server, store = asyncio.run(asyncio.wait_for(main(), 120))
    try:
        selector = server.coordinator.strategy.selector
        assert isinstance(selector, GatedScheduler) and selector.scheduler.name == "adaptive"
        ends = [e for line in (tmp_path / "events.jsonl").read_text().splitlines()
                if (e := json.loads(line))["kind"] == "round_end"]
        assert [e["round"] for e in ends] == [1, 2]
        assert set(ends[-1]["scheduling"]["tier"]) == {"0", "1", "2"}  # every client measured and tiered
        memory = selector.scheduler.state_dict()
        resumed = FlServer(config, store)
        assert resumed.coordinator.round == 2
        assert resumed.coordinator.strategy.selector.scheduler.state_dict() == memory
        with pytest.raises(JobMismatch, match="scheduler 'adaptive'"):
            FlServer(JobConfig(strategy="tiff", scheduler="fast", rounds=2, per_round=3, min_clients=3,
                               data=DataSpec(num_clients=3)), store)
    finally:
        store.close()
