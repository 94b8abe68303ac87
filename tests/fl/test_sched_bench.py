"""scripts/bench_fl_sched.py's per-dataset training recipes and its held-out check (issue 21 item 8)."""
from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "scripts" / "bench_fl_sched.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_fl_sched_recipes", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
