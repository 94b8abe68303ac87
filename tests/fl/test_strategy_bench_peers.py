"""bench_fl_tiff --peers-from: the judged TIFF variant is run, every other strategy's run of the same cell and
seed comes from the earlier sweep's JSON, and the cell records which runs were reused and from where."""
from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_fl_tiff.py"


def load_bench():
    return load_script(SCRIPT, "bench_fl_tiff")


def fake(accuracy: float) -> dict:
    return {"accuracy": accuracy, "tokens_per_honest": 10.0, "tokens_per_malicious": 5.0, "ledger_total": 0.0}


def test_only_the_judged_variant_runs_and_the_reused_peers_are_recorded(tmp_path, monkeypatch):
    bench = load_bench()
    key = bench.cell_key("digits", 0.05, 0.5, "scaled")
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"cells": {key: {"runs": {
        "0": {"fedavg": fake(0.30), "fedadam": fake(0.60), "tiff+fedadam-sf": fake(0.01)}}}}}))
    ran = []

    def one_run(strategy, seed, *_):
        ran.append((strategy, seed))
        return fake(0.80) | {"tokens_per_honest": 20.0, "tokens_per_malicious": 1.0}

    monkeypatch.setattr(bench, "one_run", one_run)
    args = bench.parse(["--tiff", "tiff+fedadam-sf", "--robust", "fedadam", "--seeds", "2",
                        "--peers-from", str(earlier)])
    _, cell = bench.run_cell(("digits", 0.05, 0.5, "scaled", args, None))
    # seed 0: only the judged variant runs (its earlier run is never reused); seed 1 is not in the JSON
    assert ran == [("tiff+fedadam-sf", 0), ("fedavg", 1), ("tiff+fedadam-sf", 1), ("fedadam", 1)]
    assert cell["runs"]["0"]["fedadam"]["accuracy"] == 0.60 and cell["runs"]["0"]["tiff+fedadam-sf"]["accuracy"] == 0.80
    assert cell["reused_runs"] == {"fedavg": [str(earlier)], "fedadam": [str(earlier)]}
    assert cell["best_peer"] == "fedadam" and cell["targets"]["malicious_tokens"]["met"] is True
