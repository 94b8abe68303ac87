"""`fl-server report`'s library side: a baseline of another job is refused (or compared with a warning when
forced), attackers are ground truth only in simulations and "declared" otherwise, best and last accuracy."""
from __future__ import annotations

import json

import pytest

from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.config import DataSpec, JobConfig
from mlsyskit.tools.fl.coordinator import Coordinator
from mlsyskit.tools.fl.report import DB_NAME, BaselineMismatch, load_run, summarize
from mlsyskit.tools.fl.simulator import Simulation

ATTACKS = {1: "label-flip", 4: "label-flip"}


def simulate(path, strategy: str, seed: int = 0, attacks=ATTACKS):
    config = JobConfig(strategy=strategy, rounds=3, per_round=3, seed=seed, data=DataSpec(num_clients=6, seed=seed))
    path.mkdir()
    with MetaStore(path / DB_NAME) as store:
        Simulation(config, store, attacks).run()
    return load_run(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The three simulated runs the tests read (each is only read: load_run, summarize, `report --json`),
    simulated once for the module: tiff and the default (fedavg) for seed 0, fedavg for seed 1."""
    root = tmp_path_factory.mktemp("runs")
    simulate(root / "tiff", "tiff")
    simulate(root / "default", "fedavg")
    simulate(root / "other", "fedavg", seed=1)
    return root


def test_a_baseline_of_another_job_is_refused_unless_forced(runs):
    tiff, same, other = load_run(runs / "tiff"), load_run(runs / "default"), load_run(runs / "other")
    summary = summarize(tiff, same)
    assert "warnings" not in summary and summary["baseline"]["strategy"] == "fedavg"
    assert summary["honest_tokens_vs_baseline"] is not None
    with pytest.raises(BaselineMismatch, match=r"different job \(seed, data differ"):
        summarize(tiff, other)
    forced = summarize(tiff, other, force=True)
    assert any(w.startswith("baseline differs in seed: 1 vs 0") for w in forced["warnings"])
    assert forced["honest_tokens_vs_baseline"] is not None  # compared, but said loudly


def test_attackers_are_ground_truth_in_simulation_and_declared_otherwise(runs, tmp_path):
    run = load_run(runs / "tiff")
    summary = summarize(run)
    assert summary["attackers"] == "simulation ground truth" and run.malicious == [1, 4]
    assert summary["malicious_providers"] == 2
    assert 0 < summary["best_accuracy"] and summary["best_round"] in (1, 2, 3)
    assert summary["final_accuracy"] == run.rounds[-1]["global"]["accuracy"]
    # a real run only knows what clients declared, and says so
    config = JobConfig(strategy="tiff", rounds=1, per_round=2, data=DataSpec(num_clients=3, seed=2))
    (tmp_path / "real").mkdir()
    with MetaStore(tmp_path / "real" / DB_NAME) as store:
        c = Coordinator(config, store)
        c.register(0, {"num_samples": c.partition_sizes[0], "declared_attack": "none"})
        c.register(2, {"num_samples": c.partition_sizes[2], "declared_attack": "noisy-labels"})
    real = load_run(tmp_path / "real")
    assert summarize(real)["attackers"] == "declared by clients" and real.malicious == [2]


def test_report_cli_exits_2_for_another_jobs_baseline_and_warns_with_force(runs):
    from typer.testing import CliRunner

    from mlsyskit.core.errors import UsageError
    from mlsyskit.tools.fl.server_cli import app

    args = ["report", "--run-dir", str(runs / "tiff"), "--baseline", str(runs / "other"), "--json"]
    refused = CliRunner().invoke(app, args)
    assert isinstance(refused.exception, UsageError) and refused.exception.exit_code == 2
    assert "different job" in str(refused.exception)
    forced = CliRunner().invoke(app, [*args, "--force"])
    assert forced.exit_code == 0, forced.output
    summary = json.loads(forced.stdout)
    assert summary["attackers"] == "simulation ground truth" and summary["warnings"]
