"""The benchmark script runs end to end on a tiny configuration and records checkable targets."""
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bench_marble_small(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_marble.py"), "--out", str(out), "--seeds", "1",
         "--synthetic-jobs", "40", "--families", "load,heavy-tail", "--scale", "--scale-jobs", "1500",
         "--scale-cluster", "6x8", "--latency-jobs", "2500", "--min-queue", "200", "--latency-samples", "10",
         "--daemon-queued", "60", "--daemon-steps", "3", "--scale-policies", "fifo,tiresias,marble,marble-las"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert set(doc["runs"]) == {"load", "heavy-tail"}
    for family in ("load", "heavy-tail"):
        for error in ("0.0", "0.1", "0.25"):
            for variant in ("marble", "marble-elastic", "marble-las"):
                t = doc["targets"][family][error][variant]
                assert t["met"] == all(c["met"] for c in t["checks"].values())
                assert all(c["met"] == (c["ratio"] < 1.0 if c.get("strict") else c["ratio"] <= c["threshold"])
                           for c in t["checks"].values())
        assert doc["cross_validation"][family]["chosen"] in (0.5, 0.65, 0.8, 0.95)
    first = next(iter(doc["runs"]["load"].values()))["0"]
    assert set(first["0.0"]) == {"fifo", "backfill", "optimus", "tiresias", "marble", "marble-elastic", "marble-las"}
    assert first["0.1"]["tiresias"] == first["0.0"]["tiresias"]       # model-free policies run once
    assert doc["scale"]["runs"]["marble"]["summary"]["jobs"] == 1500
    assert all(v["decisions"] == 10 and v["queued_max"] >= 200 and v["cpu_p99_ms"] > 0
               for v in doc["latency"]["policies"].values())
    assert set(doc["latency"]["policies"]) == set(doc["daemon_step"]) == {"fifo", "tiresias", "marble", "marble-las"}
    for policy, peers in doc["daemon_step"].items():   # both peers ran against the same full cluster
        assert peers["kept"]["gpus_held"] == peers["rescan"]["gpus_held"] > 0 and peers["kept"]["steps"] == 3, policy
    floors = doc["targets"]["load"]["0.0"]["marble-las"]["checks"]
    assert all(0 < floors[k]["floor"] for k in ("vs_optimus", "vs_tiresias", "vs_fifo_every_run"))
