"""Scheduling figures from stored round records, the report's plots, and the benchmark's target checks."""
from __future__ import annotations

import json
import math

import pytest

from mlsyskit.tools.fl.sched_report import schedule_metrics
from tests.conftest import load_script


def record(rnd, duration, accuracy, reports):
    return {"round": rnd, "selected": sorted(reports), "duration_s": duration, "global": {"accuracy": accuracy},
            "reports": {str(c): {"metrics": {"cpu_time_s": cpu}, "status": status} for c, (cpu, status)
                        in reports.items()}}


def test_schedule_metrics_by_hand():
    records = [record(1, 10.0, 0.3, {0: (4.0, "valid"), 1: (6.0, "failed")}),
               record(2, 5.0, 0.6, {0: (4.0, "valid"), 2: (2.0, "valid")})]
    m = schedule_metrics(records, population=4, client_accuracy={0: 0.5, 1: 0.7, 2: 0.9, 3: 0.9}, target=0.5)
    assert m["time_to_target_s"] == 15.0 and m["sim_time_s"] == 15.0 and m["final_accuracy"] == 0.6
    assert m["cpu_s"] == 16.0 and m["wasted_cpu_s"] == 6.0 and m["wasted_fraction"] == pytest.approx(6 / 16)
    assert m["participation_jain"] == pytest.approx(4 ** 2 / (4 * (4 + 1 + 1)))  # counts 2, 1, 1, 0
    assert m["cpu_jain"] == pytest.approx(16 ** 2 / (4 * (64 + 36 + 4)))
    assert m["client_accuracy_worst10_mean"] == 0.5 and m["client_accuracy_std"] == pytest.approx(0.1658, abs=1e-4)
    assert schedule_metrics(records, 4, None, target=0.9)["time_to_target_s"] is None


def test_report_plots_accuracy_vs_wall_clock_and_fairness(tmp_path):
    from conftest import invoke_cli

    from mlsyskit.tools.fl.server_cli import app

    runs = {}
    for scheduler in ("fast", "rfair"):
        runs[scheduler] = tmp_path / scheduler
        result = invoke_cli(app, ["simulate", "--strategy", "fedavg", "--dataset", "synthetic", "--clients", "30",
                                  "--per-round", "3", "--rounds", "3", "--scheduler", scheduler, "--eval-clients",
                                  "10", "--round-timeout", "600", "--run-dir", str(runs[scheduler]), "-q"])
        assert result.exit_code == 0, result.output
    report = invoke_cli(app, ["report", "--run-dir", str(runs["fast"]), "--baseline", str(runs["rfair"]),
                              "--out", str(tmp_path / "plots"), "--json"])
    assert report.exit_code == 0, report.output
    summary = json.loads(report.stdout)
    sched = summary["scheduling"]
    assert sched["scheduler"] == "fast" and sched["clients_evaluated"] == 10 and sched["sim_time_s"] > 0
    assert 0 < sched["participation_jain"] <= 1 and math.isfinite(sched["cpu_s"])
    for name in ("accuracy_time.png", "fairness.png"):
        path = tmp_path / "plots" / name
        assert path.is_file() and path.read_bytes()[:4] == b"\x89PNG"


def test_benchmark_checks_every_target_and_writes_json(tmp_path, monkeypatch):
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "bench_fl_sched.py"
    bench = load_script(path, "bench_fl_sched")
    out = tmp_path / "b.json"
    monkeypatch.setattr("sys.argv", ["bench", "--clients", "20", "--per-round", "3", "--datasets", "synthetic",
                                     "--seeds", "0", "--rounds", "3", "--eval-clients", "5", "--json-out", str(out)])
    bench.main()
    doc = json.loads(out.read_text())
    (cell,) = doc["cells"]
    assert set(cell["means"]) == set(bench.SCHEDULERS)
    assert len(cell["targets"]) == 6 and all(isinstance(t["met"], bool) for t in cell["targets"].values())
    # the checks themselves: a cell where fast is 2x faster than random meets the target, 1.5x does not
    means = {name: {"time_to_target_s": 100.0, "final_accuracy": 0.5, "client_accuracy_std": 0.1,
                    "participation_jain": 0.5} for name in bench.SCHEDULERS}
    means["fast"]["time_to_target_s"] = 50.0
    assert bench.cell_targets(means)["fast_tta_vs_random<=0.5"]["met"]
    means["fast"]["time_to_target_s"] = 66.0
    checks = bench.cell_targets(means)
    assert not checks["fast_tta_vs_random<=0.5"]["met"] and not checks["rfair_participation_jain>=0.9"]["met"]
    assert not checks["adaptive_beats_oort(tta or final)"]["met"]  # a tie is not better
