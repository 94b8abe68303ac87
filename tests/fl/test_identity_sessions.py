"""Identity and errors of real sessions (issue 21 item 7), an in-process server with mutual TLS:
a second process with a certificate already in use is refused while the first keeps its session (and
its pay); a client certificate signed by another CA is told "the server refused the client certificate";
every client's token summary equals the ledger."""
from __future__ import annotations

import asyncio
import logging

import pytest

from mlsyskit.core.rpc import ClientTls, ServerTls
from mlsyskit.core.rpc_tls import issue_certs
from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.client import ClientStopped, FlClient
from mlsyskit.tools.fl.config import DataSpec, JobConfig, TrainSpec
from mlsyskit.tools.fl.data import load_client
from mlsyskit.tools.fl.incentive.ledger import client_account

pytestmark = pytest.mark.slow  # a server listening on loopback


def test_a_second_session_with_a_certificate_in_use_is_refused_and_the_first_keeps_its_session(tmp_path, caplog):
    files = issue_certs(tmp_path / "certs", client_ids=["0", "1"])
    stranger = issue_certs(tmp_path / "other-ca", client_ids=["0"])  # same id, another CA
    config = JobConfig(strategy="fedavg", rounds=8, per_round=2, min_clients=2, round_timeout_s=60.0,
                       train=TrainSpec(epochs=2, local_only_epochs=1), data=DataSpec(num_clients=2, seed=3))
    tls = ServerTls.from_files(files.server_cert, files.server_key, client_ca=files.ca)
    data = {cid: load_client(config.data, cid)[0] for cid in (0, 1)}

    def client(cid, address, certs=files, **kw):
        return FlClient(address, cid, data[cid], tls=ClientTls.from_files(files.ca, *certs.client(str(cid))), **kw)

    # +1.5 s per local training: the job still runs (>= 10 s after round 1) when the duplicate, which first
    # fetches the job and warms torch up, joins; with 6 x 0.5 s one fresh-clone run saw it join after the end.
    def slow(cid, address):
        return client(cid, address, slowdown=(1, 1.5))

    async def main():
        from mlsyskit.tools.fl.server import FlServer

        store = MetaStore(tmp_path / "fl.db")
        server = FlServer(config, store, tls=tls, eval_timeout_s=20.0, heartbeat_s=0.5)  # silent > 20 s: replaced
        port = await server.start()
        address = f"localhost:{port}"
        try:
            with pytest.raises(ClientStopped, match="refused the client certificate"):
                await client(0, address, certs=stranger, reconnect_s=5).run()
            serving = asyncio.create_task(server.serve(registration_timeout_s=60))
            first = [asyncio.create_task(slow(cid, address).run()) for cid in (0, 1)]
            while not server.outcomes:  # the job is under way: client 0's session is live
                await asyncio.sleep(0.01)  # polling the server's state for a condition
            duplicate = client(0, address, reconnect_s=1.0, backoff_initial_s=0.05, backoff_max_s=0.2)
            try:  # refused until it gives up, or told the job is done if it ended meanwhile: never a task
                await duplicate.run()
                ended = "done"
            except ClientStopped as e:
                ended = str(e)
            summaries = await asyncio.gather(*first)
            await serving
        finally:
            await server.stop()
        return server, store, summaries, duplicate, ended

    with caplog.at_level(logging.WARNING, logger="mlsyskit.fl"):
        server, store, summaries, duplicate, ended = asyncio.run(asyncio.wait_for(main(), 240))
    assert duplicate.summary.rounds_trained == 0, ended  # never trained, so never paid
    assert ended == "done" or "already has a live session" in ended
    assert "refused a second session for client 0" in caplog.text
    assert all(s.done for s in summaries)
    assert len(server.outcomes) == config.rounds
    for outcome in server.outcomes:  # the first client 0 was never evicted: no round lost it
        assert all("reconnected" not in r.reason and r.status == "valid" for r in outcome.reports.values())
    from mlsyskit.tools.fl.incentive.ledger import Ledger

    ledger = Ledger(store)
    pay, balances = ledger.totals_by("pay", "payee"), ledger.balances()
    for cid, summary in enumerate(summaries):
        assert summary.reconnects == 0
        assert abs(summary.tokens_earned - pay.get(client_account(cid), 0.0)) < 1e-9
        assert abs(summary.balance - balances[client_account(cid)]) < 1e-9
    store.close()
