"""scripts/bench_kv.py end to end at a tiny size: every system answers redis-benchmark, every bespokv
row is paired with its Redis peer, and the targets follow from the measured ratios."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kv.conftest import REDIS_HINT, needs_redis

pytestmark = pytest.mark.slow  # every test here starts servers, clusters or processes

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_kv.py"
SYSTEMS = {"redis 1x1", "redis 1+2 async", "1x1 direct", "1x1 proxy", "1x3 ms-sc direct", "1x3 ms-sc proxy",
           "1x3 ms-ec direct", "1x3 ms-ec proxy"}


def test_bench_kv_small_run_writes_paired_ratios_and_targets(tmp_path) -> None:
    needs_redis()
    if shutil.which("redis-benchmark") is None:
        pytest.skip(REDIS_HINT)
    out = tmp_path / "bench.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--requests", "2000", "--rounds", "1", "--clients", "4",
                          "--tests", "SET,GET,LPUSH", "--out", str(out)], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert {r["system"] for r in rows} == SYSTEMS
    assert len(rows) == 3 * len(SYSTEMS) and {r["test"] for r in rows} == {"SET", "GET", "LPUSH"}
    assert len(report["loadavg_per_round"]) == 1 and len(report["machine"]["loadavg_end"]) == 3
    for r in rows:
        assert r["failed_runs"] == [] and len(r["runs"]) == 1, (r["system"], r["failed_runs"])
        assert r["rps"] > 0 and r["p50_ms"] >= 0, r["system"]
        if r["system"].startswith("redis"):
            assert "rps_ratio" not in r
            continue
        peer = next(p for p in rows if p["system"] == r["peer"] and p["test"] == r["test"])
        assert math.isclose(r["rps_ratio"]["median"], r["rps"] / peer["rps"], rel_tol=1e-9)
        if r["test"] == "LPUSH":  # compared with Redis, no target of its own
            assert "targets" not in r and not math.isnan(r["cpu_ratio"]["median"])
            continue
        floor = {"1x1": 0.3, "ms-sc": 0.2, "ms-ec": 0.3}[r["group"]]
        assert r["targets"][f"rps >= {floor}x"] is (r["rps_ratio"]["median"] >= floor)
        # a CPU ratio may be inf at this size: a server's CPU time can stay under psutil's 10 ms tick
        assert not math.isnan(r["cpu_ratio"]["median"])
        assert r["targets"]["cpu/op <= 4.0x"] is (r["cpu_ratio"]["median"] <= 4.0)
