"""Real fl-server and fl-client processes on loopback: 10 clients with mutual TLS (`fl-server certs`) and a
token, a client killed mid-round that rejoins, a server restart that resumes from its checkpoint, and a
server killed with SIGKILL while every selected client trains: the job completes with the same client
processes."""
from __future__ import annotations

import json
import subprocess
import time

import pytest

from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.config import DataSpec
from mlsyskit.tools.fl.incentive.ledger import Ledger
from mlsyskit.tools.fl.partition import write_partition
from tests.conftest import free_port, wait_for_port

pytestmark = pytest.mark.slow


_PARTS: dict[int, object] = {}  # server port -> the folders `fl-server partition` wrote for its clients


def start_server(pm, port, run_dir, *extra):
    """A real server that holds only the validation/test sets of a digits partition written beside run_dir
    (once per test); its clients each get their own folder of it (start_client)."""
    clients = int(extra[list(extra).index("--clients") + 1])
    parts = run_dir.parent / "parts"
    if not parts.exists():
        write_partition(DataSpec(dataset="digits", num_clients=clients), parts)
    _PARTS[port] = parts
    args = ["fl-server", "run", "--strategy", "tiff", "--validation", str(parts / "server"), "--address",
            f"127.0.0.1:{port}", "--run-dir", str(run_dir), "--registration-timeout", "60", "--round-timeout", "20",
            *extra]
    proc = pm.start(args)
    wait_for_port(port, proc=proc, timeout=60)
    return proc


def start_client(pm, port, cid, *extra, **popen):
    return pm.start(["fl-client", "run", "--server", f"127.0.0.1:{port}", "--client-id", str(cid),
                     "--data", str(_PARTS[port] / f"client-{cid}"), "--reconnect", "60", *extra], **popen)


def proc_env() -> dict:
    import os

    from tests.conftest import VENV_BIN

    return {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def finish(pm, proc, timeout=120) -> tuple[int, str]:
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pm.stop(proc)
        raise
    return proc.returncode, " ".join((stderr or b"").decode().split())  # rich wraps long lines at the terminal width


def books(run_dir):
    with MetaStore(run_dir / "fl.db") as store:
        ledger = Ledger(store)
        rounds = [r for _, r in store.read_log("fl_rounds")]
        return ledger.total(), ledger.totals_by("endowment"), ledger.totals_by("pay"), rounds


def test_ten_client_processes_five_tiff_rounds_with_mutual_tls_and_token(proc_manager, tmp_path):
    certs = tmp_path / "certs"
    subprocess.run(["fl-server", "certs", str(certs), "--clients", "10"], check=True, capture_output=True,
                   env=proc_env())
    (tmp_path / "token").write_text("fl-secret\n")
    port = free_port()
    server = start_server(proc_manager, port, tmp_path / "run", "--clients", "10", "--per-round", "5",
                          "--rounds", "5", "--min-clients", "10", "--certs", str(certs),
                          "--token-file", str(tmp_path / "token"), "--json")
    auth = ["--certs", str(certs), "--token-file", str(tmp_path / "token")]
    clients = [start_client(proc_manager, port, cid, *auth, *(["--attack", "label-flip"] if cid < 2 else []))
               for cid in range(10)]
    # while the job runs: a client without the token, one with the token but another client's certificate,
    # and one in plaintext are each refused with a clear message; none disturbs the job
    (tmp_path / "bad").write_text("guess")
    intruder = start_client(proc_manager, port, 3, "--certs", str(certs), "--token-file", str(tmp_path / "bad"))
    impostor = start_client(proc_manager, port, 4, "--tls-ca", str(certs / "ca.pem"), "--tls-cert",
                            str(certs / "client-5.pem"), "--tls-key", str(certs / "client-5.key"),
                            "--token-file", str(tmp_path / "token"))
    plain = start_client(proc_manager, port, 6, "--token-file", str(tmp_path / "token"))
    code, stderr = finish(proc_manager, intruder)
    assert code == 1 and "bad or missing token" in stderr
    code, stderr = finish(proc_manager, impostor)
    assert code == 1 and "certificate is for client 5; it cannot act as client 4" in stderr
    code, stderr = finish(proc_manager, plain)
    assert code == 1 and "expects TLS and this client sent plaintext" in stderr
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


def test_client_killed_with_sigkill_mid_round_is_failed_unpaid_and_rejoins(proc_manager, tmp_path):
    port = free_port()
    run_dir = tmp_path / "run"
    # --fill-timeout 60: a round waits (up to 60 s) for per_round=3 connected clients, so round 2 waits for
    # the rejoin; --min-clients 2 alone would let it go on with the two that stayed. 20 local epochs: the
    # SIGKILL lands while client 2 trains (it prints the line polled for just before it starts)
    (tmp_path / "job.toml").write_text("[train]\nepochs = 20\n")
    server = start_server(proc_manager, port, run_dir, "--clients", "3", "--per-round", "3", "--rounds", "3",
                          "--min-clients", "3", "--fill-timeout", "60", "--round-timeout", "600",
                          "--config", str(tmp_path / "job.toml"))
    clients = [start_client(proc_manager, port, cid) for cid in (0, 1)]
    log = tmp_path / "client-2.log"
    victim = start_client(proc_manager, port, 2, "-v", stderr=log.open("w"))
    deadline = time.monotonic() + 240
    while "round 1: selected; training" not in " ".join(log.read_text().split()):
        assert time.monotonic() < deadline and victim.poll() is None, "client 2 never trained round 1"
        time.sleep(0.01)  # polling a file for a condition, with a deadline
    proc_manager.kill(victim)  # kill -9 mid-training
    assert victim.returncode == -9
    clients.append(start_client(proc_manager, port, 2))  # rejoins with the same id
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
    clients = [start_client(proc_manager, port, cid, "--json") for cid in range(3)]
    code, _ = finish(proc_manager, server)
    assert code == 3
    total, _, _, rounds = books(run_dir)
    assert [r["round"] for r in rounds] == [1, 2] and abs(total) < 1e-9
    server = start_server(proc_manager, port, run_dir, *common)
    code, stderr = finish(proc_manager, server)
    assert code == 0, stderr
    assert "resuming after round 2" in stderr
    summaries = []
    for client in clients:
        out, err = client.communicate(timeout=120)
        assert client.returncode == 0, err.decode()[-2000:]
        assert "Traceback" not in err.decode()
        summaries.append(json.loads(out))
    total, endowments, pay, rounds = books(run_dir)
    assert [r["round"] for r in rounds] == [1, 2, 3, 4]
    assert abs(total) < 1e-9 and all(v == 1000.0 for v in endowments.values()) and len(endowments) == 3
    # each client's own token summary is the ledger's, though round 2's news died with the first server
    with MetaStore(run_dir / "fl.db") as store:
        balances = Ledger(store).balances()
    for cid, summary in enumerate(summaries):
        assert abs(summary["tokens_earned"] - pay.get(f"client:{cid}", 0.0)) < 1e-9, (cid, summary, pay)
        assert abs(summary["balance"] - balances[f"client:{cid}"]) < 1e-9


def test_server_killed_while_every_selected_client_trains_job_completes_with_the_same_clients(proc_manager, tmp_path):
    """kill -9 of fl-server once every client has said it is training round 2 (20 epochs: a second or more), then
    the same command again. The three client processes are never restarted: each finishes training, finds the
    server gone (any transport error), backs off, reconnects, gets the very same round-2 task from the restarted
    server and re-sends its update; rounds 1-3 are each recorded and paid once."""
    port = free_port()
    run_dir = tmp_path / "run"
    (tmp_path / "job.toml").write_text("[train]\nepochs = 20\n")
    # generous deadlines: on a loaded 2-core machine 20 epochs can take tens of seconds per client
    common = ["--clients", "3", "--per-round", "3", "--rounds", "3", "--min-clients", "3",
              "--config", str(tmp_path / "job.toml"), "--round-timeout", "600", "--registration-timeout", "600"]
    server = start_server(proc_manager, port, run_dir, *common)
    logs = [tmp_path / f"client-{cid}.log" for cid in range(3)]
    clients = [start_client(proc_manager, port, cid, "-v", stderr=logs[cid].open("w")) for cid in range(3)]

    def training(path) -> bool:  # the client prints this line just before it starts local training
        return "round 2: selected; training" in " ".join(path.read_text().split())

    deadline = time.monotonic() + 240
    while not all(training(path) for path in logs):
        assert time.monotonic() < deadline and server.poll() is None, "round 2 never reached every client"
        time.sleep(0.01)  # polling files for a condition, with a deadline
    proc_manager.kill(server)
    assert all(c.poll() is None for c in clients)
    server = start_server(proc_manager, port, run_dir, *common)
    code, stderr = finish(proc_manager, server, timeout=180)
    assert code == 0, stderr
    assert "resuming after round 1" in stderr
    for client, path in zip(clients, logs, strict=True):
        code, _ = finish(proc_manager, client)
        out = " ".join(path.read_text().split())
        assert code == 0, out
        assert "lost the server" in out and "the same task again (server restarted); re-sending the update" in out
        assert out.index("round 2: selected; training") < out.index("lost the server")
    total, endowments, pay, rounds = books(run_dir)
    assert [r["round"] for r in rounds] == [1, 2, 3] and abs(total) < 1e-9 and len(endowments) == 3
    assert all(r["reports"][str(c)]["status"] == "valid" for r in rounds for c in range(3))
    starts = [json.loads(line)["round"] for line in (run_dir / "events.jsonl").read_text().splitlines()
              if '"round_start"' in line]
    assert starts == [1, 2, 2, 3]  # round 2 was opened twice, recorded once
