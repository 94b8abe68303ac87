"""A client that reads batches gets what the server queued for it at once as one wire message (the
receipt of the update that closed a round, the round's end and the next task), the same messages in
the same order as a client that reads them one by one; every update still gets its receipt."""
from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

from mlsyskit.core.rpc import RpcClient, RpcError, StatusCode
from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.config import DataSpec, JobConfig
from mlsyskit.tools.fl.data import load_client
from mlsyskit.tools.fl.server import FlServer
from mlsyskit.tools.fl.server_wire import Receipts, SessionQueue, next_messages


def _types(items: list) -> list:
    return [m["type"] if isinstance(m, dict) else m for m in items]


def test_next_messages_takes_what_is_queued_up_to_the_end_of_a_session():
    async def main():
        one_by_one, batching = SessionQueue(batches=False), SessionQueue(batches=True)
        for queue in (one_by_one, batching):
            for kind in ("receipt", "round_end", "train"):
                queue.put_nowait({"type": kind})
        alone = await next_messages(one_by_one)  # a client from before batches: one at a time
        together = await next_messages(batching)
        failure = RpcError(StatusCode.INVALID_ARGUMENT, "bad message")
        for item in ({"type": "round_end"}, {"type": "done"}, {"type": "train"}, None, {"type": "receipt"}, failure,
                     {"type": "train"}):
            batching.put_nowait(item)
        ends = [await next_messages(batching) for _ in range(3)]
        return alone, together, ends, failure, batching.qsize()

    alone, together, ends, failure, left = asyncio.run(main())
    assert _types(alone) == ["receipt"] and _types(together) == ["receipt", "round_end", "train"]
    # "done" is the last message of a session, None ends it, an RpcError fails it: nothing after them is taken
    assert [_types(e) for e in ends] == [["round_end", "done"], ["train", None], ["receipt", failure]]
    assert left == 1


def _receipt(round_num: int, accepted: bool) -> dict:
    return {"type": "receipt", "round": round_num, "accepted": accepted, "reason": "" if accepted else "no"}


def test_receipts_refusals_leave_at_once_acceptances_with_the_round_end_or_after_the_hold():
    async def main():
        receipts, batching, one_by_one = Receipts(hold_s=3600.0), SessionQueue(batches=True), SessionQueue()
        receipts.send(one_by_one, _receipt(1, True), closes_round=False)
        receipts.send(batching, _receipt(1, True), closes_round=False)
        held = batching.qsize()
        receipts.send(batching, _receipt(1, False), closes_round=False)  # a refusal: at once, after what was held
        first = [batching.get_nowait() for _ in range(batching.qsize())]
        receipts.send(batching, _receipt(2, True), closes_round=False)
        receipts.send(one_by_one, _receipt(2, False), closes_round=True)  # closes the round: held, then flushed
        before_flush = (batching.qsize(), one_by_one.qsize())
        receipts.flush()
        quick, fresh = Receipts(hold_s=0.0), SessionQueue(batches=True)
        quick.send(fresh, _receipt(3, True), closes_round=False)
        timed_out = await asyncio.wait_for(fresh.get(), 10)  # released by the hold's timer, no round end needed
        return held, first, before_flush, batching.get_nowait(), [one_by_one.get_nowait() for _ in range(2)], timed_out

    held, first, before_flush, flushed, old_client, timed_out = asyncio.run(main())
    assert held == 0 and [(r["round"], r["accepted"]) for r in first] == [(1, True), (1, False)]
    assert before_flush == (0, 1) and (flushed["round"], flushed["accepted"]) == (2, True)
    assert [(r["round"], r["accepted"]) for r in old_client] == [(1, True), (2, False)]
    assert timed_out["round"] == 3


@pytest.mark.slow  # starts a server (listens on a socket)
def test_a_batching_client_hears_the_same_messages_in_fewer_wire_messages(tmp_path):
    config = JobConfig(rounds=2, per_round=2, round_timeout_s=30.0, data=DataSpec(num_clients=2))
    wire: dict[int, list[dict]] = {0: [], 1: []}

    async def client(address: str, cid: int, batches: bool) -> None:
        samples = load_client(config.data, cid)[0].num_samples
        async with RpcClient(address) as rpc:
            session = rpc.bidi("session", timeout=60)
            await session.send({"client_id": cid, "num_samples": samples, "local_only_accuracy": 0.5,
                                "batches": batches})
            async for message in session:
                wire[cid].append(message)
                for task in message["messages"] if message["type"] == "batch" else [message]:
                    if task["type"] == "train":  # a step of seeded noise: accepted (aligned with nothing)
                        rng = np.random.default_rng([cid, task["round"]])
                        weights = {k: (v + rng.normal(0.0, 0.05, v.shape)).astype(v.dtype)
                                   for k, v in task["weights"].items()}
                        await session.send({"client_id": cid, "round": task["round"], "weights": weights,
                                            "metrics": {"num_samples": samples, "loss": 0.5, "quality": 0.9,
                                                        "train_time_s": 0.01, "cpu_time_s": 0.01}})
                    elif task["type"] == "evaluate":
                        await rpc.call("evaluate", {"client_id": cid, "accuracy": 0.5})
                    elif task["type"] == "done":
                        session.cancel()
                        return

    async def main():
        store = MetaStore(tmp_path / "fl.db")
        server = FlServer(config, store, eval_timeout_s=10.0)
        port = await server.start()
        address = f"127.0.0.1:{port}"
        try:
            await asyncio.gather(server.serve(registration_timeout_s=30), client(address, 0, True),
                                 client(address, 1, False))
        finally:
            await server.stop()
        store.close()
        return server

    server = asyncio.run(asyncio.wait_for(main(), 60))
    assert [o.reports[c].status for o in server.outcomes for c in (0, 1)] == ["valid"] * 4

    def flat(cid: int) -> list[tuple[str, int | None]]:
        return [(m["type"], m.get("round")) for w in wire[cid] for m in (w["messages"] if w["type"] == "batch"
                                                                         else [w])]

    expected = [("welcome", 0), ("train", 1), ("receipt", 1), ("round_end", 1), ("train", 2), ("receipt", 2),
                ("round_end", 2), ("evaluate", None), ("done", None)]
    assert flat(0) == flat(1) == expected  # every update acknowledged, in the same order for both
    assert all(w["type"] != "batch" for w in wire[1])
    # client 0's receipt waited for the round's close (held, or its update closed the round): it, the round's end
    # and what came next left as one wire message
    assert [_types(w["messages"]) for w in wire[0] if w["type"] == "batch"] == [
        ["receipt", "round_end", "train"], ["receipt", "round_end", "evaluate"]]


def test_a_receipt_that_comes_with_its_round_end_is_not_a_second_info_line(caplog):
    from mlsyskit.tools.fl.client import FlClient
    from mlsyskit.tools.fl.task import ClientData

    empty = np.zeros((0, 2), np.float32)
    client = FlClient("127.0.0.1:1", 0, ClientData(0, empty, np.zeros(0, np.int64), empty, np.zeros(0, np.int64)))
    with caplog.at_level(logging.DEBUG, logger="mlsyskit.fl.client"):
        client._receipt(_receipt(1, True))  # alone (held past the hold): the client hears it was received
        client._receipt(_receipt(2, True), verdict_follows=True)  # the round's verdict line follows at once
        client._receipt(_receipt(3, False), verdict_follows=True)  # a refusal is always a warning
    assert [(r.levelno, r.getMessage()[:8]) for r in caplog.records] == [
        (logging.INFO, "round 1:"), (logging.DEBUG, "round 2:"), (logging.WARNING, "round 3:")]
