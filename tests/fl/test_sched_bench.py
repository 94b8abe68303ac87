"""scripts/bench_fl_sched.py's per-dataset training recipes and its held-out check (issue 21 item 8)."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tests.conftest import load_script

_PATH = Path(__file__).resolve().parents[2] / "scripts" / "bench_fl_sched.py"


@pytest.fixture(scope="module")
def bench():
    return load_script(_PATH, "bench_fl_sched_recipes")


def _run(seed: int, tta: float | None) -> dict:
    return {"seed": seed, "time_to_target_s": tta}


def test_held_out_check_is_per_seed_and_only_on_held_out_seeds(bench):
    runs = {"adaptive": [_run(0, 300.0), _run(3, 100.0), _run(4, None)],
            "oort": [_run(0, 100.0), _run(3, 150.0), _run(4, 200.0)]}
    checks = bench.held_out_targets(runs, [3, 4])
    assert set(checks) == {"seed 3: adaptive_tta<oort_tta", "seed 4: adaptive_tta<oort_tta"}  # seed 0 tuned on
    assert checks["seed 3: adaptive_tta<oort_tta"]["met"]
    assert not checks["seed 4: adaptive_tta<oort_tta"]["met"]  # never reaching the target loses
    runs["oort"][2] = _run(4, None)
    assert not bench.held_out_targets(runs, [4])["seed 4: adaptive_tta<oort_tta"]["met"]  # both never: no win
    runs["adaptive"][2] = _run(4, 50.0)
    assert bench.held_out_targets(runs, [4])["seed 4: adaptive_tta<oort_tta"]["met"]  # Oort never, we did
    assert bench.held_out_targets(runs, []) == {} and bench.held_out_targets({"oort": runs["oort"]}, [3]) == {}


def test_recipe_is_per_dataset_and_flags_override_it(bench):
    args = argparse.Namespace(epochs=None, lr=None, hidden=None, batch_size=16)
    mnist, synthetic = bench.train_spec(args, "mnist1d"), bench.train_spec(args, "synthetic")
    assert (mnist.epochs, mnist.lr) == (bench.RECIPES["mnist1d"]["epochs"], bench.RECIPES["mnist1d"]["lr"])
    assert (synthetic.epochs, synthetic.lr) == (bench.RECIPES["synthetic"]["epochs"], bench.RECIPES["synthetic"]["lr"])
    assert mnist != synthetic
    forced = bench.train_spec(argparse.Namespace(epochs=7, lr=None, hidden=None, batch_size=16), "mnist1d")
    assert forced.epochs == 7 and forced.lr == mnist.lr


def _args(bench, tmp_path, doc: dict | None, **over) -> argparse.Namespace:
    args = argparse.Namespace(epochs=None, lr=None, hidden=None, batch_size=16, rounds=1000, time_budget=600.0,
                              availability="synthetic", mean_on=300.0, mean_off=100.0, slowdown_fraction=0.2,
                              slowdown_horizon=600.0, eval_clients=1000, schedulers=["adaptive"], peers=None)
    if doc is not None:
        args.peers = tmp_path / "peers.json"
        args.peers.write_text(__import__("json").dumps(doc))
    return argparse.Namespace(**(vars(args) | over))


def test_peers_come_from_the_matching_cell_and_seed_and_only_on_the_same_settings(bench, tmp_path):
    settings = {k: getattr(_args(bench, tmp_path, None), k) for k in bench.SAME_WORLD}
    train = bench.train_spec(_args(bench, tmp_path, None), "mnist1d").__dict__
    runs = {"random": [_run(7, 300.0) | {"target_accuracy": 0.4}, _run(8, 200.0)],
            "oort": [_run(7, 100.0), _run(8, 90.0)], "adaptive": [_run(7, 1.0)]}
    doc = {"settings": settings, "cells": [{"dataset": "synthetic", "clients": 100, "per_round": 10, "train": {},
                                            "runs": {}},
                                           {"dataset": "mnist1d", "clients": 100, "per_round": 10, "train": train,
                                            "runs": runs}]}
    peers = bench.peer_runs(_args(bench, tmp_path, doc), "mnist1d", 100, 10, 7)
    assert peers == {"random": runs["random"][0], "oort": runs["oort"][0]}  # adaptive is the one rerun
    assert bench.peer_runs(_args(bench, tmp_path, None), "mnist1d", 100, 10, 7) == {}
    with pytest.raises(SystemExit, match="time_budget"):
        bench.peer_runs(_args(bench, tmp_path, doc, time_budget=300.0), "mnist1d", 100, 10, 7)
    with pytest.raises(SystemExit, match="recipe"):
        bench.peer_runs(_args(bench, tmp_path, doc, epochs=9), "mnist1d", 100, 10, 7)


def test_stop_at_target_runs_leave_out_only_the_per_client_figures(bench):
    keys = ("final_accuracy", "sim_time_s", "cpu_s", "wasted_cpu_s", "wasted_fraction", "participation_jain",
            "cpu_jain")
    runs = [_run(0, 10.0) | dict.fromkeys(keys, 1.0), _run(1, 30.0) | dict.fromkeys(keys, 3.0)]
    means = bench.mean_metrics(runs)
    assert means["time_to_target_s"] == 20.0 and means["final_accuracy"] == 2.0
    assert "client_accuracy_std" not in means


def test_a_run_stopped_at_its_target_ends_at_the_first_round_that_reached_it(bench, tmp_path):
    args = _args(bench, tmp_path, None, time_budget=None, eval_clients=5, set={})
    config = bench.job("synthetic", 6, 2, 4, 0, bench.train_spec(args, "synthetic"))
    whole = bench.run_one(config, "random", args)
    accs = [r["global"]["accuracy"] for r in whole["records"]]
    first = next(i for i, a in enumerate(accs) if a >= accs[1])
    stopped = bench.run_one(config, "random", args, stop_at=accs[1])
    assert len(whole["records"]) == 4 and len(stopped["records"]) == first + 1
    assert [r["global"]["accuracy"] for r in stopped["records"]] == accs[:first + 1]
