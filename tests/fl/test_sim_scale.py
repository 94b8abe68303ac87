"""Scale without per-client work up front: lazy synthetic users, the population registered in one
transaction, one transaction per round, baselines trained only when a reimbursement needs them, and
progress lines during start-up. (The 10k/100k timing targets are measured by scripts/bench_fl_sched.py.)"""
from __future__ import annotations

import numpy as np

from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.config import DataSpec, JobConfig, TrainSpec
from mlsyskit.tools.fl.data import load_federated
from mlsyskit.tools.fl.leaf_synthetic import EVAL_USERS, SyntheticUsers
from mlsyskit.tools.fl.simulator import Simulation, SimulationOptions
from mlsyskit.tools.fl.training import local_only_accuracy

WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")


class CountingStore(MetaStore):
    """Counts commits: explicit transactions, and writes outside one (each commits on its own)."""

    def __init__(self, path) -> None:
        self.commits = 0
        super().__init__(path)

    def _run(self, what, sql, params=()):
        verb = sql.split(None, 1)[0].upper()
        if verb == "BEGIN" or (verb in WRITES and self._depth == 0):
            self.commits += 1
        return super()._run(what, sql, params)


def test_five_thousand_clients_touch_only_the_selected_and_commit_once_per_round():
    spec = DataSpec(dataset="synthetic", num_clients=5000, seed=5)
    config = JobConfig(strategy="tiff", rounds=3, per_round=5, seed=5, round_timeout_s=600.0, data=spec,
                       train=TrainSpec(epochs=1, hidden=16, local_only_epochs=2))
    store = CountingStore(":memory:")
    commits = []
    sim = Simulation(config, store, options=SimulationOptions(scheduler="adaptive", eval_clients=20))
    users: SyntheticUsers = sim.data.clients
    users.make.cache_clear()
    before = store.commits
    sim.run(on_round=lambda o: commits.append(store.commits))
    # the ground-truth record and the registration of 5,000 clients: two commits; then one per round
    assert commits[0] - before == 3 and np.diff(commits).tolist() == [1, 1]
    assert len(sim.coordinator.clients) == 5000
    assert sim.coordinator.ledger.totals_by("endowment").keys() == {f"client:{c}" for c in range(5000)}
    # data was made only for the selected and the evaluated clients (the eval users were made at load)
    selected = {c for o in sim.result.outcomes for c in o.selected}
    assert users.make.cache_info().misses <= len(selected | set(sim.evaluated_clients()))
    # baselines exist only for the consumers a reimbursement looked at
    with_baseline = {c for c, info in sim.coordinator.clients.items() if info["local_only_accuracy"] is not None}
    assert with_baseline and with_baseline <= selected | set(sim.evaluated_clients())
    assert len(sim.result.client_accuracy) == 20


def test_synthetic_users_are_pure_functions_of_the_seed_and_learnable():
    spec = DataSpec(dataset="synthetic", num_clients=300, seed=1, synthetic_alpha=0.25, synthetic_beta=0.5)
    data = load_federated(spec)
    fresh = SyntheticUsers(spec)
    for user in (0, 17, 299):
        a, b = data.clients[user], fresh[user]
        assert np.array_equal(a.x_train, b.x_train) and np.array_equal(a.y_test, b.y_test)
    assert data.partition_sizes() == tuple(data.clients[u].num_samples for u in range(300))
    assert len(data.y_test) + len(data.y_val) == sum(len(data.clients[u].y_test) for u in fresh.eval_users())
    assert len(fresh.eval_users()) == min(300, EVAL_USERS)
    # natural partitions: users' label mixes differ
    mixes = [np.bincount(data.clients[u].y_train, minlength=10) / data.clients[u].num_samples for u in range(30)]
    assert np.mean([np.abs(m - np.mean(mixes, axis=0)).sum() for m in mixes]) > 0.3
    # learnable: one model on 40 users' pooled data beats the majority class on the global test set by far
    from mlsyskit.tools.fl.data import ClientData

    pooled = ClientData(-1, np.concatenate([data.clients[u].x_train for u in range(40)]),
                        np.concatenate([data.clients[u].y_train for u in range(40)]), data.x_test, data.y_test)
    accuracy = local_only_accuracy(pooled, TrainSpec(local_only_epochs=5, hidden=32, batch_size=64), 60, 10,
                                  seed=0)
    majority = np.bincount(data.y_test).max() / len(data.y_test)
    assert accuracy > 2.5 * majority, (accuracy, majority)


def test_simulate_cli_prints_start_up_phases_and_refuses_bad_scheduler_options(tmp_path):
    from conftest import invoke_cli

    from mlsyskit.tools.fl.server_cli import app

    base = ["simulate", "--strategy", "fedavg", "--dataset", "synthetic", "--clients", "300", "--per-round", "3",
            "--rounds", "1", "--eval-clients", "5", "--round-timeout", "600"]
    ok = invoke_cli(app, [*base, "--scheduler", "oort", "--run-dir", str(tmp_path / "ok"), "--json"])
    assert ok.exit_code == 0, ok.output
    assert "registering 300 clients" in ok.output and '"rounds": 1' in ok.stdout
    for args, message in ((["--scheduler", "fastest"], "choose from"),
                          (["--scheduler", "oort", "--weights", "fast=1"], "free weights"),
                          (["--scheduler", "fast", "--weights", "fast"], "NAME=NUMBER"),
                          (["--scheduler", "fast", "--weights", "speed=1"], "weights may only name"),
                          (["--backend", "mpi"], "backend must be one of"),
                          (["--availability", str(tmp_path / "missing.json")], "missing.json")):
        bad = invoke_cli(app, [*base, *args, "--run-dir", str(tmp_path / "bad")])
        assert bad.exit_code == 2 and message in bad.output, (args, bad.output)
