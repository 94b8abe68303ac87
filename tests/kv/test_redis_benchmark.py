"""redis-benchmark's default test list runs to the end against `bespokv up` (issue 14, item 5)."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import redis

from mlsyskit.core.net import free_range
from tests.kv.conftest import down_if_recorded
from tests.kv.test_cli import cli

pytestmark = pytest.mark.slow  # every test here starts servers, clusters or processes

DEFAULT_TESTS = ["PING_INLINE", "PING_MBULK", "SET", "GET", "INCR", "LPUSH", "RPUSH", "LPOP", "RPOP", "SADD",
                 "HSET", "SPOP", "ZADD", "ZPOPMIN", "LPUSH (needed to benchmark LRANGE)",
                 "LRANGE_100 (first 100 elements)", "LRANGE_300 (first 300 elements)",
                 "LRANGE_500 (first 500 elements)", "LRANGE_600 (first 600 elements)", "MSET (10 keys)"]


@pytest.fixture
def bench_cluster(tmp_path):
    if shutil.which("redis-benchmark") is None:
        pytest.skip("needs redis-benchmark: apt-get install -y redis-tools")
    d = str(tmp_path / "cluster")
    base = free_range(1 + 2 * 2 * 3)
    cli("up", "--shards", "2", "--replicas", "3", "--base-port", str(base), "--data-dir", d)
    try:
        yield base
    finally:
        down_if_recorded(d)


def test_redis_benchmark_default_list_runs_to_the_end(bench_cluster: int) -> None:
    base = bench_cluster
    run = subprocess.run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(base), "-n", "40", "-c", "2", "-q"],
                         capture_output=True, text=True, timeout=180)
    # a test over in under a millisecond prints "inf requests per second" (seen for PING_MBULK)
    finished = [m.group(1) for line in run.stdout.replace("\r", "\n").splitlines()
                if (m := re.match(r"^(.+?): (?:[\d.]+|inf) requests per second", line))]
    assert run.returncode == 0 and "rror" not in run.stdout + run.stderr, run.stdout + run.stderr
    assert finished == DEFAULT_TESTS, finished
    r = redis.Redis("127.0.0.1", base)  # what it wrote is there, with the right types, through the proxy
    assert r.type("mylist") == b"list" and r.llen("mylist") > 0
    assert r.type("myhash") == b"hash" and r.type("myset") == b"none"  # SPOP took every SADD member
    assert len(r.lrange("mylist", 0, 99)) == min(100, r.llen("mylist"))
    r.close()
