"""The benchmark script runs end to end on a tiny configuration and records checkable targets."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mlsyskit.tools.sched.workloads import PHILLY

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow   # runs the script in a subprocess


def test_bench_marble_small(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_marble.py"), "--out", str(out), "--seeds", "1",
         "--heldout", "heldout-large", "--policies", "tiresias,optimus,marble", "--windows", "1", "--window", "100",
         "--scale", "--scale-jobs", "300", "--scale-cluster", "6x8", "--latency-jobs", "1000", "--min-queue", "150",
         "--latency-samples", "10", "--daemon-queued", "60", "--daemon-steps", "3",
         "--scale-policies", "fifo,marble"],
        capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert {w.split("@")[0] for w in doc["tuning_workloads"]} == {"workload-1", "workload-2", "workload-3", "workload-4"}
    apps = doc["breakdown"]["heldout-large"]["16x4"]["marble"]["apps"]
    assert abs(sum(a["jct_share"] for a in apps.values()) - 1) < 1e-9
    assert all(0 <= a["mean_queued_h"] <= a["mean_jct_h"] and a["held_per_work"] > 0.5 for a in apps.values())
    for cluster in ("16x4", "16x6"):
        res = doc["heldout"]["heldout-large"][cluster]
        assert set(res["policies"]) == {"tiresias", "optimus", "marble"}
        assert set(res["policies"]["marble"]["seeds"]) == {"1"}
        assert res["met"] == all(c["met"] for c in res["checks"].values())
        assert all(c["met"] == (c["ratio"] <= c["threshold"]) for c in res["checks"].values())
        assert 0 < res["checks"]["vs_tiresias"]["floor"] < 1.5
        assert doc["heldout_summary"][cluster]["met"] == (doc["heldout_summary"][cluster]["workloads_met"] >= 1)
        assert doc["heldout_summary"][cluster]["per_target"]["vs_tiresias"] == int(res["checks"]["vs_tiresias"]["met"])
        assert 0 < res["oracle_order_bound"]["avg_jct_s"] and res["oracle_order_bound"]["vs_optimus"] > 0
    window = next(iter(doc["realistic"].values()))["16x6"]
    assert window["checks"]["vs_tiresias"]["threshold"] == 1.02
    assert doc["scale"]["runs"]["marble"]["summary"]["jobs"] == 300 and PHILLY.is_file()
    assert doc["scale"]["runs"]["marble"]["machine_load_average"] >= 0
    assert all(v["decisions"] == 10 and v["queued_max"] >= 150 and v["cpu_p99_ms"] > 0
               for v in doc["latency"]["policies"].values())
    assert all(v["gpus_held"] > 0 and v["steps"] == 3 for v in doc["daemon_step"].values())
