"""Real fl-client processes report what they measure and `fl-server run --scheduler` uses it.

Three client processes on loopback, one local epoch per round (~0.05 s); two are steadily slow (+0.6 s
per local training from round 1, `--slowdown`), client 2 is fast until round 3 and then +6 s per
training. The fast scheduler tiers
clients by the latency the server measured (round trip on its own clock), so client 2 starts in
the fastest tier; after its slowdown it misses the scheduler's deadline, its late updates are
counted as wasted work, and it is re-tiered into the slowest tier: all read from the run's
per-round report (events.jsonl, round_end)."""
from __future__ import annotations

import json

import pytest

from tests.conftest import free_port
from tests.fl.test_loopback import finish, start_client, start_server

pytestmark = pytest.mark.slow  # starts a server (listens on a socket) or a process


def round_ends(run_dir) -> list[dict]:
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return [e for e in events if e["kind"] == "round_end"]


def test_client_slowed_mid_run_is_re_tiered_by_the_scheduler_from_measured_latency(proc_manager, tmp_path):
    port = free_port()
    run_dir = tmp_path / "run"
    (tmp_path / "job.toml").write_text("[train]\nepochs = 1\nlocal_only_epochs = 1\n")
    # --min-clients 2 and --fill-timeout 4: a round waits up to 4 s for client 2 while it is still busy
    # with its late update, then goes on without it
    server = start_server(proc_manager, port, run_dir, "--config", str(tmp_path / "job.toml"), "--strategy",
                          "fedavg", "--scheduler", "fast", "--clients", "3", "--per-round", "3", "--rounds", "6",
                          "--min-clients", "2", "--fill-timeout", "4", "--heartbeat", "0.5", "--linger", "5")
    clients = [start_client(proc_manager, port, 0, "--slowdown", "1:0.6"),
               start_client(proc_manager, port, 1, "--slowdown", "1:0.6"),
               start_client(proc_manager, port, 2, "--slowdown", "3:6")]
    code, stderr = finish(proc_manager, server, timeout=180)
    assert code == 0, stderr
    for client in clients:
        code, stderr = finish(proc_manager, client)
        assert code == 0, stderr
    ends = round_ends(run_dir)
    assert [e["round"] for e in ends] == list(range(1, 7))
    by_round = {e["round"]: e for e in ends}

    # measured and reported: every valid report carries the client's and the server's timings
    for e in ends:
        for report in e["reports"].values():
            if report["status"] == "valid":
                m = report["metrics"]
                assert m["received_s"] >= m["train_time_s"] > 0 and m["comm_time_s"] >= 0
                assert 0 <= m["host_cpu_percent"] <= 100 and m["local_s"] > 0 and m["cpu_time_s"] > 0
    # before the slowdown client 2 is the fastest: tier 0, and the steady clients are above it
    before = by_round[2]["scheduling"]
    assert before["tier"]["2"] == 0
    assert before["latency_ema_s"]["2"] < min(before["latency_ema_s"]["0"], before["latency_ema_s"]["1"])
    # slowed from round 3: it misses the scheduler's deadline (shorter than the 30 s round timeout)
    assert by_round[3]["deadline_s"] < 30
    assert by_round[3]["reports"]["2"]["status"] == "failed"
    assert "deadline" in by_round[3]["reports"]["2"]["reason"]
    # ... its late answers are wasted work, counted
    assert ends[-1]["wasted"]["updates"] >= 1 and ends[-1]["wasted"]["train_s"] >= 3
    # ... and it is re-tiered into the slowest tier
    after = ends[-1]["scheduling"]
    slowest = max(after["tier"].values())
    assert after["tier"]["2"] == slowest > 0
    assert after["retiers"] > before["retiers"]
    assert after["latency_ema_s"]["2"] > max(after["latency_ema_s"]["0"], after["latency_ema_s"]["1"])


def test_a_stopped_client_is_masked_by_its_missing_heartbeats_and_offered_again_when_resumed(proc_manager, tmp_path):
    """SIGSTOP freezes client 2 between rounds: its connection stays up (gRPC keepalive would notice only after
    ~40 s), but its heartbeats stop, so within 3 x 0.3 s rounds select among the other two without waiting for
    it; after SIGCONT it is offered again. The job completes with all three processes. (30 rounds: the
    round after the SIGSTOP still selects client 2 and waits out its 5 s deadline, by when it is masked; the
    whole sequence took 6 rounds here.)"""
    import os
    import signal
    import time

    port = free_port()
    run_dir = tmp_path / "run"
    (tmp_path / "job.toml").write_text("[train]\nepochs = 1\nlocal_only_epochs = 1\n")
    server = start_server(proc_manager, port, run_dir, "--config", str(tmp_path / "job.toml"), "--strategy",
                          "fedavg", "--clients", "3", "--per-round", "3", "--rounds", "30", "--min-clients", "2",
                          "--fill-timeout", "0", "--round-timeout", "5", "--heartbeat", "0.3", "--linger", "5")
    clients = [start_client(proc_manager, port, cid, "--slowdown", "1:0.1") for cid in range(3)]
    events = run_dir / "events.jsonl"

    def starts() -> list[dict]:
        lines = events.read_text().splitlines() if events.exists() else []
        return [e for line in lines if (e := json.loads(line))["kind"] == "round_start"]

    def wait_for(condition, what: str) -> dict:
        deadline = time.monotonic() + 120
        while True:
            found = [e for e in starts() if condition(e)]
            if found:
                return found[0]
            assert time.monotonic() < deadline and server.poll() is None, f"never saw {what}"
            time.sleep(0.05)  # polling the event log for a condition, with a deadline

    wait_for(lambda e: e["round"] >= 3 and e["available"] == [0, 1, 2], "round 3 with all three available")
    os.kill(clients[2].pid, signal.SIGSTOP)
    stopped_at = len(starts())
    masked = wait_for(lambda e: e["round"] > stopped_at and 2 in e["connected"] and 2 not in e["available"],
                      "a round that left the stopped client out while it was still connected")
    assert 2 not in masked["selected"]
    os.kill(clients[2].pid, signal.SIGCONT)
    resumed_at = len(starts())
    back = wait_for(lambda e: e["round"] > resumed_at and 2 in e["available"], "client 2 available again")
    assert 2 in back["selected"]
    code, stderr = finish(proc_manager, server, timeout=240)
    assert code == 0, stderr
    assert all(finish(proc_manager, c)[0] == 0 for c in clients)
