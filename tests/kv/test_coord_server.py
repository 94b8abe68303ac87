"""The embedded coordinator process: failover on missed heartbeats, kill -9 and restart at the same epoch,
a standby taking over through the SQLite leader lock, and hostile input on the wire."""
from __future__ import annotations

import socket
import sys
import time

import pytest

from mlsyskit.core.errors import RuntimeFailure
from mlsyskit.tools.kv.coord.client import CoordClient
from mlsyskit.tools.kv.shardmap import layout
from tests.conftest import ProcManager, free_port

pytestmark = pytest.mark.slow  # every test here starts servers, clusters or processes

INTERVAL = 0.2  # heartbeat interval given to the server (x3 misses = 0.6 s to detect)


def wait_until(condition, timeout: float = 15.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def start_coord(procs: ProcManager, state_dir, port: int, log_path, name: str):
    with open(log_path, "ab") as log:
        return procs.start([sys.executable, "-m", "mlsyskit.tools.kv.coord.server", "--state-dir", str(state_dir),
                            "--port", str(port), "--name", name, "--interval", str(INTERVAL),
                            "--min-timeout", "0"], stderr=log)


def serving(proc) -> str:
    """Block until the process prints its ready line (it does so only once it leads)."""
    line = proc.stdout.readline().decode()
    assert line.startswith("serving "), line
    return line


def reachable(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


@pytest.fixture
def procs():
    manager = ProcManager()
    yield manager
    manager.stop_all()


def test_silent_node_is_failed_over_and_a_restart_resumes_the_epoch(procs, tmp_path):
    port = free_port()
    proc = start_coord(procs, tmp_path / "state", port, tmp_path / "coord.log", "c1")
    serving(proc)
    client = CoordClient([("127.0.0.1", port)])
    m = client.init(layout("ms-sc", "memory", 1, 3, "127.0.0.1", [7001, 7002, 7003]))
    t0 = time.monotonic()
    # s0r0 and s0r2 keep beating; the middle s0r1 falls silent.
    new = wait_until(lambda: (client.heartbeat("s0r0"), client.heartbeat("s0r2"), client.map())[2].epoch > m.epoch
                     and client.map(), what="failover of the silent middle")
    detect_s = time.monotonic() - t0
    assert new.epoch == 2 and new.shards == (("s0r0", "s0r2"),)
    assert detect_s < 10, detect_s
    print(f"silent middle failed over {detect_s:.2f} s after its registration "
          f"(timeout {INTERVAL} s x 3 misses)")
    assert client.heartbeat("s0r1") is False                # the deposed node learns it must rejoin
    procs.kill(proc)                                        # kill -9
    client.close()
    with pytest.raises(RuntimeFailure, match="no coordinator reachable"):
        client.map()
    proc = start_coord(procs, tmp_path / "state", port, tmp_path / "coord.log", "c1-again")
    assert serving(proc).strip().endswith("epoch 2")
    assert client.map() == new
    joined = client.join(0, "s0r3", "127.0.0.1", 7004)
    assert joined.epoch == 3 and joined.shards == (("s0r0", "s0r2", "s0r3"),)
    client.close()


def test_standby_takes_over_after_kill_9_of_the_leader(procs, tmp_path):
    state = tmp_path / "state"
    leader_port, standby_port = free_port(), free_port()
    leader = start_coord(procs, state, leader_port, tmp_path / "leader.log", "leader")
    serving(leader)
    standby = start_coord(procs, state, standby_port, tmp_path / "standby.log", "standby")
    wait_until(lambda: b"waiting for the leader lock" in (tmp_path / "standby.log").read_bytes(),
               what="the standby to start waiting")
    assert not reachable(standby_port)                      # a standby serves nothing
    client = CoordClient([("127.0.0.1", leader_port), ("127.0.0.1", standby_port)])
    m = client.init(layout("aa-sc", "memory", 1, 2, "127.0.0.1", [7001, 7002]))
    assert client.status()["leader"] == "leader"
    procs.kill(leader)
    t0 = time.monotonic()
    serving(standby)
    took_over_s = time.monotonic() - t0
    status = wait_until(lambda: client.status(), what="the standby to answer")
    assert status["leader"] == "standby" and status["epoch"] == m.epoch
    assert took_over_s < 10, took_over_s
    print(f"standby serving {took_over_s:.2f} s after kill -9 of the leader")
    client.close()


def test_hostile_clients_do_not_hurt_the_server(procs, tmp_path):
    port = free_port()
    proc = start_coord(procs, tmp_path / "state", port, tmp_path / "coord.log", "c1")
    serving(proc)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"x" * (2 << 20) + b"\n")                 # over the 1 MiB line limit
        assert b"too long" in s.makefile("rb").readline()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b'{"op": "init", "map": "garbage"}\n\xff\n')
        f = s.makefile("rb")
        assert b"bad_request" in f.readline() and b"bad_request" in f.readline()
    half = socket.create_connection(("127.0.0.1", port), timeout=5)
    half.sendall(b'{"op": "map"')                           # a client that stops mid-request
    client = CoordClient([("127.0.0.1", port)])
    assert client.map() is None and proc.poll() is None
    half.close()
    client.close()


def test_exit_codes_usage_2_runtime_1(procs, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    base = [sys.executable, "-m", "mlsyskit.tools.kv.coord.server"]
    cases = [(["--state-dir", str(tmp_path / "s"), "--port", "0"], 2, b"--port"),
             (["--state-dir", str(tmp_path / "s"), "--port", "x"], 2, b"port"),
             (["--state-dir", str(tmp_path / "s"), "--port", "7000", "--misses", "0"], 2, b"misses"),
             (["--state-dir", str(blocker), "--port", str(free_port())], 1, b"error: cannot open")]
    for args, code, text in cases:
        proc = procs.start(base + args)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == code and text in err, (args, proc.returncode, err)


def test_sigstop_of_the_leader_neither_splits_the_brain_nor_fails_everyone_on_resume(procs, tmp_path):
    import os
    import signal
    import threading
    state = tmp_path / "state"
    leader_port, standby_port = free_port(), free_port()
    leader = start_coord(procs, state, leader_port, tmp_path / "leader.log", "leader")
    serving(leader)
    standby = start_coord(procs, state, standby_port, tmp_path / "standby.log", "standby")
    admin = CoordClient([("127.0.0.1", leader_port)], timeout_s=10)
    m = admin.init(layout("ms-sc", "memory", 1, 3, "127.0.0.1", [7001, 7002, 7003]))
    stop = threading.Event()

    def beat():   # the three nodes keep beating every 0.05 s throughout
        nodes = CoordClient([("127.0.0.1", leader_port)], timeout_s=10)
        while not stop.is_set():
            for n in m.nodes:
                nodes.heartbeat(n)
            stop.wait(0.05)
        nodes.close()
    beater = threading.Thread(target=beat)
    beater.start()
    try:
        assert wait_until(lambda: admin.map().epoch == 1)
        os.kill(leader.pid, signal.SIGSTOP)
        stopped_until = time.monotonic() + 2.0                 # > 3x the 0.6 s detection timeout
        while time.monotonic() < stopped_until:
            assert not reachable(standby_port)                 # the paused leader still holds the lock
            time.sleep(0.1)
        os.kill(leader.pid, signal.SIGCONT)
        calm_until = time.monotonic() + 2.0
        while time.monotonic() < calm_until:
            assert admin.map().epoch == 1                      # no failover storm after the resume
            time.sleep(0.1)
        assert b"no heartbeat" not in (tmp_path / "leader.log").read_bytes()
        assert standby.poll() is None
    finally:
        stop.set()
        beater.join()
        admin.close()


def test_with_a_secret_only_clients_that_prove_it_are_served(procs, tmp_path):
    """The attacker reaches the coordinator's port: without the cluster secret it can neither read nor
    replace the map nor keep a dead node alive with forged heartbeats; a proof recorded on one
    connection is useless on another (the nonce), and a wrong secret is refused."""
    import json

    from mlsyskit.tools.kv.peerauth import coord_proof, load_or_create_secret, new_secret

    secret = load_or_create_secret(tmp_path)
    port = free_port()
    with open(tmp_path / "coord.log", "ab") as log:
        proc = procs.start([sys.executable, "-m", "mlsyskit.tools.kv.coord.server", "--state-dir",
                            str(tmp_path / "state"), "--port", str(port), "--interval", str(INTERVAL),
                            "--secret-file", str(tmp_path / "cluster.secret")], stderr=log)
    serving(proc)
    admin = CoordClient([("127.0.0.1", port)], secret=secret)
    m = admin.init(layout("ms-sc", "memory", 1, 3, "127.0.0.1", [7001, 7002, 7003]))

    def raw(*lines: dict) -> list[dict]:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s, s.makefile("rb") as f:
            replies = []
            for line in lines:
                s.sendall(json.dumps(line).encode() + b"\n")
                replies.append(json.loads(f.readline()))
            return replies

    hostile = layout("ms-sc", "memory", 1, 1, "127.0.0.1", [6666]).to_dict()
    for request in ({"op": "map"}, {"op": "cas", "expected_epoch": m.epoch, "map": hostile},
                    {"op": "heartbeat", "node": "s0r1"}, {"op": "join", "shard": 0, "node": "evil",
                                                           "host": "127.0.0.1", "port": 6666}):
        (reply,) = raw(request)
        assert reply["ok"] is False and reply["kind"] == "refused" and "authenticate first" in reply["error"]
    # a recorded proof replayed on a new connection, a proof without a nonce, and a wrong secret
    hello, good = raw({"op": "hello"}, {"op": "auth", "proof": "x"})
    assert good["ok"] is False
    nonce = bytes.fromhex(hello["nonce"])
    (_, replayed, after) = raw({"op": "hello"}, {"op": "auth", "proof": coord_proof(secret, nonce)}, {"op": "map"})
    assert replayed["ok"] is False and after["ok"] is False
    (no_nonce,) = raw({"op": "auth", "proof": coord_proof(secret, b"")})
    assert no_nonce["ok"] is False
    with pytest.raises(RuntimeFailure, match="refused this client"):
        CoordClient([("127.0.0.1", port)], secret=new_secret()).map()
    # the map is the one the admin stored, and the right secret is served as before
    assert admin.map() == m and admin.heartbeat("s0r0") is True
    (hello, ok, served) = raw({"op": "hello"}, {"op": "auth", "proof": "0"}, {"op": "map"})
    assert ok["ok"] is False and served["ok"] is False
    admin.close()


def test_a_client_with_a_secret_is_served_by_a_coordinator_without_one(procs, tmp_path):
    """A coordinator started by hand without --secret-file checks nothing; a client that proves a
    secret anyway is served as before (its hello and auth are answered, not refused as unknown)."""
    from mlsyskit.tools.kv.peerauth import new_secret

    port = free_port()
    serving(start_coord(procs, tmp_path / "state", port, tmp_path / "coord.log", "c1"))
    client = CoordClient([("127.0.0.1", port)], secret=new_secret())
    m = client.init(layout("ms-sc", "memory", 1, 3, "127.0.0.1", [7001, 7002, 7003]))
    assert client.map() == m
    client.close()
