"""The benchmark script runs end to end on a tiny configuration and records checkable targets."""
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bench_marble_small(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_marble.py"), "--out", str(out), "--seeds", "2",
         "--synthetic-jobs", "200", "--scale-jobs", "3000", "--scale-nodes", "20", "--scale-policies", "marble",
         "--min-queue", "300", "--latency-samples", "20"],
        capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert set(doc["jct"]) == {"workload-1", "workload-2", "workload-3", "workload-4", "synthetic:200@0.9"}
    for w in doc["jct"].values():
        assert len(w["targets"]["marble_vs_fifo"]["reduction_per_seed"]) == 2
        assert set(w["seeds"]["0"]) == {"fifo", "backfill", "optimus", "tiresias", "marble", "marble-elastic"}
    assert doc["scale"]["runs"]["marble"]["summary"]["jobs"] == 3000
    assert doc["latency"]["policies"]["marble"]["decisions"] == 20
    assert doc["latency"]["queue_size"]["min"] >= 300
    assert isinstance(doc["all_targets_met"], bool) and doc["all_targets_met"] == all(doc["targets"].values())
