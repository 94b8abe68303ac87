"""The ZooKeeper coordinator backend against a real ZooKeeper 3.8 (standalone and a 3-member ensemble)
on free loopback ports: compare-and-set epochs, ephemeral liveness, leader election, kill -9 of a
session holder and of a ZooKeeper member."""
from __future__ import annotations

import sys
import threading
import time

import pytest

from mlsyskit.core.errors import RuntimeFailure
from mlsyskit.tools.kv.coord import zk_local
from mlsyskit.tools.kv.coord.base import EpochConflict
from mlsyskit.tools.kv.coord.failover import plan_failover
from mlsyskit.tools.kv.coord.orchestrator import fail_over
from mlsyskit.tools.kv.shardmap import NodeAddr, layout
from tests.conftest import ProcManager

pytest.importorskip("kazoo", reason="needs kazoo: pip install kazoo")
if not zk_local.available():
    pytest.skip(zk_local.INSTALL_HINT, allow_module_level=True)

from mlsyskit.tools.kv.coord.zk import ZkCoordinator  # noqa: E402

pytestmark = pytest.mark.slow  # every test here starts servers, clusters or processes

SESSION_S = 1.0  # short sessions so a killed holder's ephemeral znodes go quickly


def wait_until(condition, timeout: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
    return value


@pytest.fixture(scope="module")
def zk(tmp_path_factory):
    with zk_local.LocalZooKeeper(tmp_path_factory.mktemp("zk")) as server:
        yield server


@pytest.fixture
def root(request):
    return f"/t/{request.node.name.replace('[', '_').replace(']', '')}"


@pytest.fixture
def coords(zk, root):
    made = []

    def make():
        made.append(ZkCoordinator(zk.hosts, root, session_timeout_s=SESSION_S))
        return made[-1]
    yield make
    for c in made:
        c.close()


def first_map(mode="ms-sc"):
    return layout(mode, "memory", 1, 3, "127.0.0.1", [7001, 7002, 7003])


def test_map_compare_and_set_and_conflicts(coords):
    a, b = coords(), coords()
    m = first_map()
    assert a.read_map() is None
    assert a.initialize(m) == m and b.initialize(first_map("aa-ec")) == m
    new = plan_failover(m, ["s0r2"])
    assert b.compare_and_set(1, new) == new
    with pytest.raises(EpochConflict):
        a.compare_and_set(1, plan_failover(m, ["s0r0"]))
    assert a.read_map() == new and sorted(a.members()) == ["s0r0", "s0r1", "s0r2"]


def test_racing_planners_commit_exactly_one_map(coords):
    a, b = coords(), coords()
    m = a.initialize(first_map())
    wins, barrier = [], threading.Barrier(2)

    def race(c, victim):
        barrier.wait()
        try:
            wins.append(c.compare_and_set(1, plan_failover(m, [victim])))
        except EpochConflict:
            pass
    threads = [threading.Thread(target=race, args=(c, v)) for c, v in ((a, "s0r0"), (b, "s0r1"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1 and a.read_map() == wins[0]


def test_liveness_is_the_session(coords):
    watcher, node = coords(), coords()
    node.register(NodeAddr("s0r1", "127.0.0.1", 7002))
    node.register(NodeAddr("s0r1", "127.0.0.1", 7002))      # re-registering on the same session is fine
    assert watcher.live() == ["s0r1"] and watcher.heartbeat("s0r1")
    assert node.heartbeat("s0r1", applied=42) and watcher.applied() == {"s0r1": 42}
    assert watcher.heartbeat("s0r9", applied=1) is False     # not live: nothing is created
    with pytest.raises(RuntimeFailure, match="already live"):
        watcher.register(NodeAddr("s0r1", "127.0.0.1", 7002))  # an impostor on another session
    seen = []
    watcher.watch_live(seen.append)
    node.close()
    wait_until(lambda: seen and seen[-1] == [], what="the ephemeral znode to go")
    assert "s0r1" in watcher.members() and not watcher.heartbeat("s0r1")


def test_a_restarted_nodes_agent_waits_for_its_old_session_instead_of_dying(zk, root, coords):
    """A node restarted within a session timeout of its kill -9 finds its liveness znode still held
    by the dead process's session. That is retriable (CoordUnavailable: the agent tries again next
    round), not a RuntimeFailure out of the agent's task: that killed the agent silently, so the
    restarted node held no lease and never rejoined (a check run that 'did not settle')."""
    import asyncio

    from mlsyskit.tools.kv.coord.aclient import CoordUnavailable
    from mlsyskit.tools.kv.coord.spec import parse_coordinator
    from mlsyskit.tools.kv.node.agent import ZkBackend

    old = coords()
    old.register(NodeAddr("s0r0", "127.0.0.1", 7001))  # the killed process's session, not yet expired
    spec = parse_coordinator(f"zookeeper://{zk.hosts}{root}", interval_s=0.2, misses=5)

    async def restarted() -> None:
        backend = ZkBackend(spec)
        try:
            with pytest.raises(CoordUnavailable, match="already live in another session"):
                await backend.register("s0r0", "127.0.0.1", 7001)
            old.close()  # its session ends (expiry, for a killed one)
            await backend.register("s0r0", "127.0.0.1", 7001)
            assert (await backend.heartbeat("s0r0", 5))[0]
        finally:
            await backend.close()
    asyncio.run(restarted())


def test_leader_election_hands_over_on_close(coords):
    a, b = coords(), coords()
    assert a.campaign("coord-a", timeout_s=5) and a.is_leader()
    assert b.campaign("coord-b", timeout_s=0.3) is False and b.leader() == "coord-a"
    a.close()
    assert b.campaign("coord-b", timeout_s=10) and b.leader() == "coord-b"


HOLDER = """
import sys, time
from mlsyskit.tools.kv.coord.zk import ZkCoordinator
from mlsyskit.tools.kv.shardmap import NodeAddr
c = ZkCoordinator(sys.argv[1], sys.argv[2], session_timeout_s=float(sys.argv[3]))
c.register(NodeAddr(sys.argv[4], "127.0.0.1", 7002))
assert sys.argv[5] != "lead" or c.campaign("holder", timeout_s=10)
print("ready", flush=True)
while True:
    time.sleep(60)
"""


def test_kill_9_of_a_session_holder_frees_its_node_and_leadership(zk, root, coords):
    procs = ProcManager()
    try:
        holder = procs.start([sys.executable, "-c", HOLDER, zk.hosts, root, str(SESSION_S), "s0r1", "lead"])
        assert holder.stdout.readline().strip() == b"ready", holder.stderr.read()
        standby = coords()
        standby.initialize(first_map())
        assert standby.live() == ["s0r1"] and standby.leader() == "holder"
        assert standby.campaign("standby", timeout_s=0.2) is False
        procs.kill(holder)                                     # kill -9: no goodbye to ZooKeeper
        t0 = time.monotonic()
        assert standby.campaign("standby", timeout_s=20)
        took_over_s = time.monotonic() - t0
        wait_until(lambda: standby.live() == [], what="the dead node's ephemeral znode to expire")
        assert took_over_s < 10, took_over_s                   # session timeout plus a margin
        after = fail_over(standby, ["s0r1"])
        assert after.epoch == 2 and after.shards == (("s0r0", "s0r2"),)
    finally:
        procs.stop_all()


def test_ensemble_survives_a_member_kill(tmp_path):
    with zk_local.LocalZooKeeper(tmp_path, members=3) as ensemble:
        c = ZkCoordinator(ensemble.hosts, "/ens", session_timeout_s=4.0)
        try:
            m = c.initialize(first_map())
            leader = [zk_local.mode(p) for p in ensemble.client_ports].index("leader")
            ensemble.kill_member(leader)                        # kill -9 the ZooKeeper leader
            new = wait_until(lambda: _try_cas(c, m), timeout=30, what="a write after re-election")
            assert new.epoch == 2 and c.read_map() == new
        finally:
            c.close()


def _try_cas(c, m):
    try:
        return c.compare_and_set(m.epoch, plan_failover(m, ["s0r0"]))
    except EpochConflict:
        return c.read_map() if c.read_map().epoch == 2 else None   # a retried write that had landed
    except Exception:   # noqa: BLE001 - ConnectionLoss/SessionExpired while the ensemble re-elects
        return None


def _start_zk_coord(procs, zk, root, name, log_path):
    with open(log_path, "ab") as log:
        return procs.start([sys.executable, "-m", "mlsyskit.tools.kv.coord.zk_main", "--zk", zk.hosts,
                            "--root", root, "--name", name, "--session-timeout", str(SESSION_S),
                            "--interval", "0.25", "--misses", "2"], stderr=log)


def test_zk_coordinator_process_fails_over_and_a_standby_takes_over_after_kill_9(zk, root, coords, tmp_path):
    procs = ProcManager()
    try:
        admin = coords()
        m = admin.initialize(first_map())
        head = procs.start([sys.executable, "-c", HOLDER, zk.hosts, root, str(SESSION_S), "s0r0", "node"])
        assert head.stdout.readline().strip() == b"ready", head.stderr.read()
        sessions = {n: coords() for n in ("s0r1", "s0r2")}      # each node on its own session
        for n, c in sessions.items():
            c.register(m.nodes[n])
        leader = _start_zk_coord(procs, zk, root, "A", tmp_path / "a.log")
        assert leader.stdout.readline().decode().strip() == "leading A epoch 1"
        standby = _start_zk_coord(procs, zk, root, "B", tmp_path / "b.log")
        wait_until(lambda: len(admin.client.get_children(f"{root}/leader")) == 2, what="B in the lock")
        procs.kill(leader)                                      # kill -9 the leading coordinator
        assert standby.stdout.readline().decode().strip() == "leading B epoch 1"
        t0 = time.monotonic()
        procs.kill(head)                                        # kill -9 the head: its session must expire
        new = wait_until(lambda: (admin.read_map().epoch > 1) and admin.read_map(), what="head failover")
        detect_s = time.monotonic() - t0
        assert new.epoch == 2 and new.shards == (("s0r1", "s0r2"),)
        assert detect_s < 10, detect_s                         # session expiry + 2 checks + slack
        print(f"head failover committed {detect_s:.2f} s after kill -9 (session timeout {SESSION_S} s)")
    finally:
        procs.stop_all()


def test_zk_coordinator_exit_codes_usage_2_unreachable_1():
    from tests.conftest import free_port
    procs = ProcManager()
    try:
        base = [sys.executable, "-m", "mlsyskit.tools.kv.coord.zk_main"]
        for args, code, text in (
                (["--zk", "127.0.0.1:1", "--misses", "0"], 2, b"misses"),
                (["--zk", "127.0.0.1:1", "--interval", "x"], 2, b"interval"),
                (["--zk", f"127.0.0.1:{free_port()}", "--connect-timeout", "1"], 1, b"error: ZooKeeper at")):
            proc = procs.start(base + args)
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == code and text in err, (args, proc.returncode, err)
    finally:
        procs.stop_all()


def test_a_sigstopped_zk_leader_is_replaced_and_exits_when_resumed(zk, root, coords, tmp_path):
    import os
    import signal
    procs = ProcManager()
    try:
        admin = coords()
        admin.initialize(first_map())
        a = _start_zk_coord(procs, zk, root, "A", tmp_path / "a.log")
        assert a.stdout.readline().decode().strip() == "leading A epoch 1"
        b = _start_zk_coord(procs, zk, root, "B", tmp_path / "b.log")
        wait_until(lambda: len(admin.client.get_children(f"{root}/leader")) == 2, what="B in the lock")
        os.kill(a.pid, signal.SIGSTOP)                          # A's session expires while it sleeps
        assert b.stdout.readline().decode().strip() == "leading B epoch 1"
        os.kill(a.pid, signal.SIGCONT)
        assert a.wait(timeout=30) == 1                          # A notices and steps down
        assert b"lost its ZooKeeper session" in (tmp_path / "a.log").read_bytes()
        assert b.poll() is None and admin.leader() == "B"
    finally:
        procs.stop_all()


def test_with_a_secret_clients_without_it_can_neither_read_nor_change_anything(zk, root):
    """The attacker reaches ZooKeeper: the cluster's znodes carry a digest ACL for the secret's
    holders only, including a root made earlier without one; another cluster secret is refused."""
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoAuthError
    from kazoo.security import OPEN_ACL_UNSAFE

    from mlsyskit.tools.kv.peerauth import new_secret

    secret = new_secret()
    ZkCoordinator(zk.hosts, root, session_timeout_s=SESSION_S).close()  # an unprotected root from before
    owner = ZkCoordinator(zk.hosts, root, session_timeout_s=SESSION_S, secret=secret)
    attacker = KazooClient(hosts=zk.hosts)
    attacker.start(timeout=10)
    try:
        m = owner.initialize(first_map())
        owner.register(NodeAddr("s0r0", "127.0.0.1", 7001))
        assert owner.campaign("c1", timeout_s=5)
        hostile = layout("ms-sc", "memory", 1, 1, "127.0.0.1", [6666]).to_json().encode()
        for attempt in (lambda: attacker.get(f"{root}/map"),
                        lambda: attacker.set(f"{root}/map", hostile),
                        lambda: attacker.create(f"{root}/live/s0r1", b"", ephemeral=True),
                        lambda: attacker.get_children(f"{root}/live"),
                        lambda: attacker.delete(f"{root}/live/s0r0"),
                        lambda: attacker.create(f"{root}/leader/evil", b""),
                        lambda: attacker.set_acls(root, OPEN_ACL_UNSAFE)):
            with pytest.raises(NoAuthError):
                attempt()
        with pytest.raises(RuntimeFailure, match="another cluster secret"):
            ZkCoordinator(zk.hosts, root, session_timeout_s=SESSION_S, secret=new_secret())
        assert owner.read_map() == m and owner.live() == ["s0r0"] and owner.is_leader()
    finally:
        attacker.stop()
        attacker.close()
        owner.close()
