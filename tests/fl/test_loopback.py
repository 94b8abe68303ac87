"""Real fl-server and fl-client processes on loopback: 10 clients with TLS and a token, a client
killed mid-round that rejoins, and a server restart that resumes from its checkpoint."""
from __future__ import annotations

import subprocess

from mlsyskit.core.rpc_tls import issue_certs
from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.incentive.ledger import Ledger
from tests.conftest import free_port, wait_for_port


def start_server(pm, port, run_dir, *extra):
    args = ["fl-server", "run", "--strategy", "tiff", "--dataset", "digits", "--address", f"127.0.0.1:{port}",
            "--run-dir", str(run_dir), "--registration-timeout", "60", "--round-timeout", "20", *extra]
    proc = pm.start(args)
    wait_for_port(port, proc=proc, timeout=60)
    return proc


def start_client(pm, port, cid, *extra):
    return pm.start(["fl-client", "run", "--server", f"127.0.0.1:{port}", "--client-id", str(cid),
                     "--dataset", "digits", "--reconnect", "60", *extra])


def finish(pm, proc, timeout=120) -> tuple[int, str]:
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pm.stop(proc)
        raise
    return proc.returncode, stderr.decode()


def books(run_dir):
    with MetaStore(run_dir / "fl.db") as store:
        ledger = Ledger(store)
        rounds = [r for _, r in store.read_log("fl_rounds")]
        return ledger.total(), ledger.totals_by("endowment"), ledger.totals_by("pay"), rounds


def test_ten_client_processes_five_tiff_rounds_with_tls_and_token(proc_manager, tmp_path):
    tls = issue_certs(tmp_path / "tls")
    (tmp_path / "token").write_text("fl-secret\n")
    port = free_port()
    server = start_server(proc_manager, port, tmp_path / "run", "--clients", "10", "--per-round", "5",
                          "--rounds", "5", "--tls-cert", str(tls.server_cert), "--tls-key", str(tls.server_key),
                          "--token-file", str(tmp_path / "token"), "--json")
    auth = ["--tls-ca", str(tls.ca), "--token-file", str(tmp_path / "token")]
    clients = [start_client(proc_manager, port, cid, *auth, *(["--malicious", "label-flip"] if cid < 2 else []))
               for cid in range(10)]
    # a client without the token is refused with a clear message and does not disturb the job
    (tmp_path / "bad").write_text("guess")
    intruder = start_client(proc_manager, port, 3, "--tls-ca", str(tls.ca), "--token-file", str(tmp_path / "bad"))
    code, stderr = finish(proc_manager, intruder)
    assert code == 2 and "bad or missing token" in stderr
    code, stderr = finish(proc_manager, server)
    assert code == 0, stderr
    for client in clients:
        code, stderr = finish(proc_manager, client)
        assert code == 0, stderr
    total, endowments, pay, rounds = books(tmp_path / "run")
    assert [r["round"] for r in rounds] == [1, 2, 3, 4, 5] and abs(total) < 1e-9
    assert len(endowments) == 10
    assert all(len(r["selected"]) == 5 for r in rounds)
    assert rounds[-1]["global"]["accuracy"] > 0.5


def test_client_killed_mid_round_is_failed_unpaid_and_rejoins(proc_manager, tmp_path):
    port = free_port()
    run_dir = tmp_path / "run"
    server = start_server(proc_manager, port, run_dir, "--clients", "3", "--per-round", "3", "--rounds", "3")
    clients = [start_client(proc_manager, port, cid) for cid in (0, 1)]
    crasher = start_client(proc_manager, port, 2, "--crash-in-round", "1")
    code, _ = finish(proc_manager, crasher)
    assert code == 3
    clients.append(start_client(proc_manager, port, 2))  # rejoins; round 2 waits for it
    code, stderr = finish(proc_manager, server)
    assert code == 0, stderr
    assert all(finish(proc_manager, c)[0] == 0 for c in clients)
    total, endowments, _, rounds = books(run_dir)
    assert rounds[0]["reports"]["2"]["status"] == "failed"
    assert rounds[1]["reports"]["2"]["status"] == "valid" and rounds[2]["reports"]["2"]["status"] == "valid"
    with MetaStore(run_dir / "fl.db") as store:
        paid_round1 = store.query("SELECT COUNT(*) FROM fl_ledger WHERE kind='pay' AND round=1 AND payee='client:2'")
    assert paid_round1[0][0] == 0
    assert abs(total) < 1e-9 and len(endowments) == 3


def test_server_restart_resumes_from_checkpoint(proc_manager, tmp_path):
    port = free_port()
    run_dir = tmp_path / "run"
    common = ["--clients", "3", "--per-round", "2", "--rounds", "4"]
    server = start_server(proc_manager, port, run_dir, *common, "--crash-after-round", "2")
    clients = [start_client(proc_manager, port, cid) for cid in range(3)]
    code, _ = finish(proc_manager, server)
    assert code == 3
    total, _, _, rounds = books(run_dir)
    assert [r["round"] for r in rounds] == [1, 2] and abs(total) < 1e-9
    server = start_server(proc_manager, port, run_dir, *common)
    code, stderr = finish(proc_manager, server)
    assert code == 0, stderr
    assert "resuming after round 2" in stderr
    assert all(finish(proc_manager, c)[0] == 0 for c in clients)
    total, endowments, _, rounds = books(run_dir)
    assert [r["round"] for r in rounds] == [1, 2, 3, 4]
    assert abs(total) < 1e-9 and all(v == 1000.0 for v in endowments.values()) and len(endowments) == 3
