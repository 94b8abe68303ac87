"""The RESP front end: unchanged Redis clients work, and bad input gets errors, never a crash."""
from __future__ import annotations

import socket
import subprocess

import hiredis
import pytest
import redis

from tests.kv.conftest import needs_redis

pytestmark = pytest.mark.slow  # every test here starts servers, clusters or processes


def node_addr(tc, node_id: str = "s0r1") -> tuple[str, int]:
    a = tc.cluster.map.nodes[node_id]
    return a.host, a.port


def raw(addr: tuple[str, int], data: bytes, replies: int = 1, expect_close: bool = False) -> list:
    """Send raw bytes; read `replies` replies (and, if asked, check the server closed the connection)."""
    reader = hiredis.Reader()
    out: list = []
    with socket.create_connection(addr, timeout=5) as s:
        s.sendall(data)
        while len(out) < replies:
            chunk = s.recv(65536)
            if not chunk:
                break
            reader.feed(chunk)
            while (r := reader.gets()) is not False:
                out.append(r)
        if expect_close:
            assert s.recv(1) == b"", "server should close after a protocol error"
    return out


def test_redis_py_unchanged(threaded_cluster) -> None:
    host, port = node_addr(threaded_cluster)
    r = redis.Redis(host=host, port=port)
    try:
        assert r.ping() is True
        assert r.set("alpha", "1") is True
        assert r.get("alpha") == b"1"
        assert r.mset({"b1": "x", "b2": "y", "b3": "z"}) is True
        assert r.mget(["b1", "b2", "b3", "nope"]) == [b"x", b"y", b"z", None]
        assert r.exists("b1", "b2", "nope") == 2
        assert r.delete("b1", "b2", "nope") == 2
        assert r.get("b1") is None
        info = r.info()
        assert info["controlet"] == "ms-sc" and info["shards"] == 2
        pipe = r.pipeline(transaction=False)
        for i in range(200):
            pipe.set(f"p{i}", i)
        for i in range(200):
            pipe.get(f"p{i}")
        results = pipe.execute()
        assert results[:200] == [True] * 200
        assert results[200:] == [str(i).encode() for i in range(200)]
        smap = r.execute_command("BKV.SHARDMAP")
        assert b'"controlet": "ms-sc"' in smap
    finally:
        r.close()


def test_redis_cli_unchanged(threaded_cluster) -> None:
    needs_redis()
    host, port = node_addr(threaded_cluster, "s1r0")

    def cli(*args: str) -> str:
        return subprocess.run(["redis-cli", "-h", host, "-p", str(port), *args], capture_output=True,
                              text=True, timeout=20, check=True).stdout.strip()

    assert cli("PING") == "PONG"
    assert cli("SET", "greeting", "hello world") == "OK"
    assert cli("GET", "greeting") == "hello world"
    assert cli("MSET", "c1", "1", "c2", "2") == "OK"
    assert cli("MGET", "c1", "c2", "c3").splitlines()[:2] == ["1", "2"]
    assert cli("--no-raw", "MGET", "c1", "c2", "c3").splitlines()[2].endswith("(nil)")
    assert cli("DEL", "c1", "c3") == "1"
    assert cli("EXISTS", "c1") == "0"
    assert "node_id:s1r0" in cli("INFO")
    assert cli("NOSUCHCOMMAND").startswith("ERR unknown command")


def test_redis_benchmark_runs(threaded_cluster) -> None:
    needs_redis()
    host, port = node_addr(threaded_cluster)
    out = subprocess.run(["redis-benchmark", "-h", host, "-p", str(port), "-c", "4", "-n", "2000", "-P", "8",
                          "-t", "set,get", "-q", "-r", "1000"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "SET:" in out.stdout and "GET:" in out.stdout and "requests per second" in out.stdout


def test_inline_commands_as_redis_benchmark_sends_them(threaded_cluster) -> None:
    addr = node_addr(threaded_cluster)
    replies = raw(addr, b"PING\r\nSET  k  v\r\n\r\nGET k\n" + hiredis.pack_command((b"GET", b"k")), replies=4)
    assert replies == [b"PONG", b"OK", b"v", b"v"]
    (unknown,) = raw(addr, b"+OK\r\n")  # a reply sent as a command is an unknown inline command
    assert isinstance(unknown, hiredis.ReplyError) and "unknown command '+OK'" in str(unknown)


def test_errors_keep_the_connection(threaded_cluster) -> None:
    addr = node_addr(threaded_cluster)
    replies = raw(addr, b"".join([
        hiredis.pack_command((b"XADD", b"stream", b"*", b"f", b"v")),
        hiredis.pack_command((b"GET",)),
        hiredis.pack_command((b"SET", b"k")),
        hiredis.pack_command((b"SET", b"k", b"v", b"EX", b"0")),
        hiredis.pack_command((b"MSET", b"a", b"1", b"b")),
        hiredis.pack_command((b"GET", b"k" * 65)),
        hiredis.pack_command((b"SET", b"k", b"v" * 1025)),
        hiredis.pack_command((b"MGET", *[b"k"] * 20)),
        hiredis.pack_command((b"SELECT", b"3")),
        hiredis.pack_command((b"PING",)),
    ]), replies=10)
    errors = [str(r) for r in replies[:9]]
    assert all(isinstance(r, hiredis.ReplyError) for r in replies[:9]), replies
    assert "unknown command 'XADD'" in errors[0]
    assert "wrong number of arguments for 'get'" in errors[1]
    assert "wrong number of arguments for 'set'" in errors[2]
    assert "invalid expire time" in errors[3] and errors[3].startswith("ERR ")  # the standard error code
    assert "wrong number of arguments for 'mset'" in errors[4]
    assert "key too long" in errors[5]
    assert "value too large" in errors[6]
    assert "too many arguments" in errors[7]
    assert "only database 0" in errors[8]
    assert replies[9] == b"PONG"


@pytest.mark.parametrize("frame", [
    b"*1\r\n$x\r\n",  # a bad length
    b"*2\r\n:1\r\n:2\r\n",  # integers instead of bulk strings
    b"*1\r\n*1\r\n$4\r\nPING\r\n",  # a nested array
    b"*0\r\n",  # an empty command
    b"*1\r\n$100000\r\n" + b"x" * 5000,  # a request over max_request_bytes (4 KiB here)
], ids=["bad-length", "integers", "nested", "empty", "oversize-request"])
def test_malformed_frames_get_an_error_and_a_close(threaded_cluster, frame: bytes) -> None:
    addr = node_addr(threaded_cluster)
    replies = raw(addr, frame, replies=1, expect_close=True)
    assert len(replies) == 1 and isinstance(replies[0], hiredis.ReplyError)
    assert "Protocol error" in str(replies[0])
    # The server is unharmed.
    assert raw(addr, hiredis.pack_command((b"PING",))) == [b"PONG"]
    assert threaded_cluster.cluster.nodes["s0r1"].stats["errors"] >= 1


def test_a_request_cut_after_one_of_its_elements_is_not_read_as_inline_commands(threaded_cluster) -> None:
    """hiredis's buffer is empty when a read ends right after an element of a long array, so the next read,
    starting with that array's next `$` header, once went to the inline-command parser and desynchronised
    the stream (seen on a peer link carrying a large message). The PING's answer proves the first read
    was handled before the rest is sent."""
    addr = node_addr(threaded_cluster)
    value = b"x" * 600  # hiredis drops what it has parsed only past 1 KiB: then its buffer is empty
    mset = hiredis.pack_command((b"MSET", *[x for i in range(7) for x in (b"cut%d" % i, value + b"%d" % i)]))
    cut = mset.index(value + b"3\r\n") + len(value) + 3  # right after an element: the rest starts with `$`
    assert mset[cut:cut + 1] == b"$"
    reader = hiredis.Reader()
    with socket.create_connection(addr, timeout=5) as s:
        s.sendall(hiredis.pack_command((b"PING",)) + mset[:cut])
        while (first := reader.gets()) is False:
            reader.feed(s.recv(65536))
        assert first == b"PONG"
        s.sendall(mset[cut:] + hiredis.pack_command((b"GET", b"cut6")))
        out: list = []
        while len(out) < 2:
            reader.feed(s.recv(65536))
            while (r := reader.gets()) is not False:
                out.append(r)
    assert out == [b"OK", value + b"6"]
