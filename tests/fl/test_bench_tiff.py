"""scripts/bench_fl_tiff.py's summary: with no malicious clients (--malicious 0) the malicious-token
target is reported as n/a (neither met nor failed) and the JSON stays valid, instead of a crash."""
from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_fl_tiff.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_fl_tiff", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_args(malicious: float) -> argparse.Namespace:
    return argparse.Namespace(seeds=1, clients=6, per_round=3, rounds=2, alpha=0.5, malicious=malicious)


def test_no_malicious_clients_reports_na_and_valid_json():
    bench = load_bench()
    args = tiny_args(0.0)
    runs = {name: {0: bench.one_run(strategy, 0, args)} for name, strategy in (("default", "fedavg"), ("tiff", "tiff"))}
    assert runs["tiff"][0]["tokens_per_malicious"] is None and runs["tiff"][0]["malicious_selections"] == 0
    summary, targets = bench.summarise(runs)
    assert summary["tiff"]["tokens_per_malicious"] is None and summary["tiff"]["tokens_per_honest"] > 0
    malicious = targets["malicious_tokens_vs_default"]
    assert malicious["measured"] is None and malicious["met"] is None and "no malicious" in malicious["note"]
    assert isinstance(targets["honest_tokens_vs_default"]["met"], bool)  # the other targets are still measured
    assert targets["ledger_conserved"]["met"] is True
    text = json.dumps({"summary": summary, "targets": targets, "runs": runs}, allow_nan=False)  # no NaN/Infinity
    assert json.loads(text)["targets"]["malicious_tokens_vs_default"]["met"] is None
    assert bench._short(malicious["measured"]) == "n/a" and bench._na(malicious["met"]) == "n/a"


def test_ratio_targets_with_malicious_clients_and_an_unpaid_baseline():
    bench = load_bench()

    def run(honest: float, malicious: float, accuracy: float) -> dict:
        return {"final_accuracy": accuracy, "last5_accuracy": accuracy, "tokens_per_honest": honest,
                "tokens_per_malicious": malicious, "honest_ever_paid": 1.0, "malicious_selections": 3,
                "honest_late_coverage": 0.5, "honest_token_jain": 0.9, "wall_s": 1.0, "ledger_total": 0.0}

    runs = {"default": {0: run(10.0, 4.0, 0.70), 1: run(10.0, 6.0, 0.70)},
            "tiff": {0: run(11.0, 3.0, 0.80), 1: run(11.0, 1.0, 0.80)}}
    _, targets = bench.summarise(runs)
    assert targets["malicious_tokens_vs_default"] == {"measured": 0.4, "target": "<= 0.80", "met": True}
    assert abs(targets["honest_tokens_vs_default"]["measured"] - 1.1) < 1e-12
    assert targets["honest_tokens_vs_default"]["met"] is True
    runs["default"] = {0: run(10.0, 0.0, 0.70)}  # malicious clients present but the default paid them nothing
    _, targets = bench.summarise(runs)
    assert targets["malicious_tokens_vs_default"]["met"] is None
    json.dumps(targets, allow_nan=False)
