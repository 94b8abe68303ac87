"""Truthful Redis and bounded resources (issue 14, items 4 and 5) through real clients."""
from __future__ import annotations

import asyncio
import socket

import hiredis
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from mlsyskit.tools.kv.ops.cluster import LocalCluster, node_datalet
from mlsyskit.tools.kv.redis.resp import Limits
from tests.kv.conftest import ThreadedCluster, make_map

pytestmark = pytest.mark.slow  # every test here starts servers, clusters or processes


def cluster(replicas: int = 1, controlet: str = "ms-sc", **kwargs) -> ThreadedCluster:
    smap = make_map(controlet, shards=1, replicas=replicas)
    return ThreadedCluster(LocalCluster(smap, lambda n: node_datalet("memory", n), **kwargs))


def addr(tc: ThreadedCluster, node: str = "s0r0") -> tuple[str, int]:
    a = tc.cluster.map.nodes[node]
    return a.host, a.port


def read_until_closed(s: socket.socket) -> bytes:
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def test_a_huge_bulk_header_is_refused_before_its_payload() -> None:
    with cluster() as tc, socket.create_connection(addr(tc), timeout=5) as s:
        s.sendall(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2147483647\r\n")  # then nothing: the server must not wait
        reply = read_until_closed(s)
        assert reply.startswith(b"-ERR Protocol error: invalid bulk length")
    with cluster(limits=Limits(max_args=16)) as tc, socket.create_connection(addr(tc), timeout=5) as s:
        s.sendall(b"*1000000\r\n$3\r\nSET\r\n")
        assert read_until_closed(s).startswith(b"-ERR Protocol error: invalid multibulk length")


def test_a_trickled_request_is_bounded_by_the_request_limit() -> None:
    limits = Limits(max_key_bytes=64, max_value_bytes=1024, max_request_bytes=4096, max_args=100_000)
    with cluster(limits=limits) as tc, socket.create_connection(addr(tc), timeout=5) as s:
        s.sendall(b"*90000\r\n" + b"$1\r\nx\r\n" * 1000)  # 7 KB, never completing the command
        assert read_until_closed(s).startswith(b"-ERR Protocol error: request larger than 4096 bytes")


def test_a_client_that_does_not_read_is_disconnected_and_others_are_served() -> None:
    limits = Limits(max_value_bytes=256 * 1024, max_output_bytes=2 * 1024 * 1024)
    with cluster(limits=limits) as tc:
        r = redis.Redis(*addr(tc))
        r.set("big", b"x" * 256 * 1024)
        hog = socket.create_connection(addr(tc), timeout=5)
        hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        hog.sendall(hiredis.pack_command((b"GET", b"big")) * 500)  # 128 MB of replies, never read
        node = tc.cluster.nodes["s0r0"]
        deadline = asyncio.run(_deadline(10))
        while node.stats["output_limit_closes"] == 0:
            assert asyncio.run(_now()) < deadline, "the hog was never disconnected"
            assert r.ping()  # meanwhile another client is served
        assert r.get("big") == b"x" * 256 * 1024
        hog.close()
        r.close()


async def _now() -> float:
    return asyncio.get_running_loop().time()


async def _deadline(seconds: float) -> float:
    return asyncio.get_running_loop().time() + seconds


def test_maxclients() -> None:
    with cluster(limits=Limits(max_clients=2)) as tc:
        first, second = redis.Redis(*addr(tc)), redis.Redis(*addr(tc))
        assert first.ping() and second.ping()
        with socket.create_connection(addr(tc), timeout=5) as third:
            assert read_until_closed(third) == b"-ERR max number of clients reached\r\n"
        assert tc.cluster.nodes["s0r0"].stats["rejected_connections"] == 1
        first.close()
        second.close()


def test_requirepass_and_auth() -> None:
    with cluster(replicas=3, requirepass=b"s3cret") as tc:
        host, port = addr(tc)
        no_retry = Retry(NoBackoff(), 0)  # redis-py retries authentication errors by default
        anonymous = redis.Redis(host, port, retry=no_retry)
        with pytest.raises(redis.AuthenticationError):
            anonymous.set("k", "v")
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host, port, password="wrong", retry=no_retry).ping()
        client = redis.Redis(host, port, password="s3cret")
        assert client.set("k", "v") and client.get("k") == b"v"
        assert redis.Redis(host, port, password="s3cret", protocol=3).get("k") == b"v"  # HELLO 3 AUTH
        # Replicas still replicate: peers authenticate with the cluster secret, not the password.
        tail = redis.Redis(*addr(tc, "s0r2"), password="s3cret")
        assert tail.get("k") == b"v"
        for c in (anonymous, client, tail):
            c.close()


def test_multi_exec_is_refused_and_nothing_queued_runs() -> None:
    with cluster(replicas=3) as tc:
        r = redis.Redis(*addr(tc))
        pipe = r.pipeline(transaction=True)
        pipe.set("t1", "a").set("t2", "b")
        with pytest.raises(redis.ResponseError):
            pipe.execute()
        assert r.get("t1") is None and r.get("t2") is None
        replies = _raw(addr(tc), [(b"MULTI",), (b"SET", b"t3", b"c"), (b"DISCARD",), (b"GET", b"t3")])
        assert isinstance(replies[0], hiredis.ReplyError) and isinstance(replies[1], hiredis.ReplyError)
        assert replies[2] == b"OK" and replies[3] is None
        r.close()


def _raw(address, commands) -> list:
    reader = hiredis.Reader()
    out: list = []
    with socket.create_connection(address, timeout=5) as s:
        s.sendall(b"".join(hiredis.pack_command(c) for c in commands))
        while len(out) < len(commands):
            reader.feed(s.recv(65536))
            while (reply := reader.gets()) is not False:
                out.append(reply)
    return out


def test_client_command_config_and_hello_are_truthful() -> None:
    with cluster(replicas=3, limits=Limits(max_clients=50)) as tc:
        r = redis.Redis(*addr(tc))
        assert r.client_setname("worker-1") and r.client_getname() == "worker-1"
        me = r.client_id()
        listed = r.client_list()
        assert any(c["id"] == str(me) and c["name"] == "worker-1" for c in listed)
        assert r.client_info()["name"] == "worker-1"
        with pytest.raises(redis.ResponseError, match="not supported"):
            r.execute_command("CLIENT", "KILL", "ID", "1")
        count, table, info = _raw(addr(tc), [(b"COMMAND", b"COUNT"), (b"COMMAND",), (b"COMMAND", b"INFO", b"get")])
        assert count == len(table) >= 10 and b"bkv.msg" not in [entry[0] for entry in table]
        assert info[0][:2] == [b"get", 2]
        assert r.config_get("maxclients") == {"maxclients": "50"}
        assert r.config_get("no-such-parameter") == {}
        assert r.config_get("proto-max-bulk-len")["proto-max-bulk-len"] == str(Limits().max_value_bytes)
        hello = redis.Redis(*addr(tc), protocol=3).execute_command("HELLO", "3")
        assert hello[b"mode"] == b"standalone" and hello[b"server"] == b"bespokv"
        with pytest.raises(redis.ResponseError):
            r.config_set("maxclients", "10")
        r.close()


def test_dbsize_keys_and_scan_span_every_shard(tmp_path) -> None:
    smap = make_map("aa-ec", shards=3, replicas=2)
    with ThreadedCluster(LocalCluster(smap, lambda n: node_datalet("memory", n))) as tc:
        r = redis.Redis(*addr(tc, "s1r1"))
        for i in range(30):
            r.set(f"user:{i}", i)
        r.set("other", 1)
        r.delete("user:0")  # an aa-ec tombstone is not a key
        assert r.dbsize() == 30
        assert sorted(r.keys("user:*")) == sorted(f"user:{i}".encode() for i in range(1, 30))
        assert sorted(r.scan_iter(match="user:1*")) == sorted(
            k.encode() for k in {f"user:{i}" for i in range(1, 30)} if k.startswith("user:1"))
        with pytest.raises(redis.ResponseError, match="FLUSHALL is not supported"):
            r.flushall()
        with socket.create_connection(addr(tc, "s0r0"), timeout=5) as s:  # peer-only
            s.sendall(hiredis.pack_command((b"BKV.KEYS", b"*")))
            assert s.recv(100).startswith(b"-NOPERM")
        r.close()


def test_internal_commands_are_refused_to_clients_even_with_the_password() -> None:
    """BKV.FLUSHSHARD from a plain client wiped its shard (issue 22); BKV.KEYS and BKV.REAP are
    internal too. A client that knows the requirepass is still no node."""
    smap = make_map("ms-sc", shards=1, replicas=3)
    with ThreadedCluster(LocalCluster(smap, lambda n: node_datalet("memory", n), requirepass=b"pw")) as tc:
        r = redis.Redis(*addr(tc, "s0r2"), password="pw")  # the tail: its writes go to the head
        r.set("k", "v")
        for internal in (("BKV.FLUSHSHARD", "k"), ("BKV.KEYS", "*"), ("BKV.REAP", "k")):
            with pytest.raises(redis.exceptions.NoPermissionError, match="authenticated replica connections"):
                r.execute_command(*internal)
        assert r.get("k") == b"v" and r.dbsize() == 1
        assert all(n.datalet.size() == 1 for n in tc.cluster.nodes.values())  # nothing flushed anywhere
        r.flushall()  # a client's FLUSHALL still works: the tail forwards it to the head as BKV.FLUSHSHARD
        assert r.dbsize() == 0
        r.close()


@pytest.mark.parametrize("controlet", ["ms-sc", "ms-ec", "aa-sc"])
def test_flushall_empties_every_replica_of_every_shard_in_order(controlet: str) -> None:
    smap = make_map(controlet, shards=2, replicas=3)
    with ThreadedCluster(LocalCluster(smap, lambda n: node_datalet("memory", n))) as tc:
        r = redis.Redis(*addr(tc, "s1r2"))
        pipe = r.pipeline(transaction=False)
        for i in range(40):
            pipe.set(f"k{i}", i)
        pipe.flushall()
        pipe.set("after", "1")  # session order: written after the flush, so it survives it
        pipe.execute()
        nodes = tc.cluster.nodes.values()
        deadline = asyncio.run(_deadline(10))
        while sum(n.datalet.size() for n in nodes) != 3:  # `after` on its shard's 3 replicas
            assert asyncio.run(_now()) < deadline, {n.node_id: n.datalet.size() for n in nodes}
        # read once every replica has it: under ms-ec this node may be a backup of `after`'s shard
        # (it is, with hash slots) and a backup's read may precede the replication of a write
        assert r.dbsize() == 1 and r.get("after") == b"1"
        r.close()
