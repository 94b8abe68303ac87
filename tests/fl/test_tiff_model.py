"""TIFF that does not hurt the model: the floor gates aggregation as well as pay, the best model by the
server's validation split is kept (and survives a restart), pay is equal until the model beats chance,
consumers who are not connected pay nothing, and selection stays diverse among trusted clients."""
from __future__ import annotations

import random

import numpy as np

from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.config import DataSpec, JobConfig, SelectionConfig
from mlsyskit.tools.fl.coordinator import Coordinator
from mlsyskit.tools.fl.data import load_federated
from mlsyskit.tools.fl.incentive.ledger import client_account
from mlsyskit.tools.fl.incentive.tiff_tokens import quality_threshold
from mlsyskit.tools.fl.outcome import ClientReport, RoundOutcome
from mlsyskit.tools.fl.selection.trusted_random import TrustedRandomSelector
from mlsyskit.tools.fl.simulator import Simulation, choose_attackers
from mlsyskit.tools.fl.training import train_local


def test_under_floor_updates_are_neither_aggregated_nor_paid_and_pay_is_equal_before_chance():
    config = JobConfig(strategy="tiff", rounds=6, per_round=6, seed=2, data=DataSpec(num_clients=16, seed=2))
    attackers = choose_attackers(16, 0.25, "label-flip", 2)
    with MetaStore(":memory:") as store:
        sim = Simulation(config, store, attackers)
        sim.run()
        pays: dict[int, dict[int, float]] = {}
        for _, rnd, _, payee, amount, kind in sim.coordinator.ledger.rows():
            if kind == "pay":
                pays.setdefault(rnd, {})[int(payee.split(":")[1])] = amount
    outcomes = sim.result.outcomes
    assert not outcomes[0].pay_by_quality  # round 1 starts from a random model: quality is noise
    assert any(o.pay_by_quality for o in outcomes)  # and the model did learn
    excluded = 0
    for o in outcomes:
        floor = quality_threshold(o, config.economy.quality_floor)
        for cid, r in o.reports.items():
            expected = r.status == "valid" and r.pay_quality >= floor and r.pay_quality > 0
            assert r.aggregated == expected, (o.round, cid, r)
            assert (cid in pays.get(o.round, {})) == expected  # aggregated exactly when paid
            excluded += r.status == "valid" and not expected
        if not o.pay_by_quality and pays.get(o.round):
            assert max(pays[o.round].values()) - min(pays[o.round].values()) < 1e-9  # one slot each
    assert excluded > 0  # the floor did exclude accepted updates, so the check above was exercised


def test_the_best_model_is_kept_reported_and_survives_a_restart(tmp_path):
    config = JobConfig(strategy="fedavg", rounds=2, per_round=3, seed=4, data=DataSpec(num_clients=3, seed=4))
    data = load_federated(config.data)
    db = tmp_path / "fl.db"
    with MetaStore(db) as store:
        c = Coordinator(config, store)
        for cid in range(3):
            c.register(cid, {"num_samples": c.partition_sizes[cid], "local_only_accuracy": 0.5})
        for attack in ("none", "label-flip"):  # a good round, then a poisoned one the default accepts
            plan = c.begin_round([0, 1, 2], now=0.0)
            for cid in plan.selected:
                result = train_local(plan.weights, data.clients[cid], config.train, data.num_features,
                                     data.num_classes, plan.seeds[cid], attack)
                assert c.submit(cid, plan.round, result.weights, result.metrics()) == (True, "")
            outcome = c.finish_round(1.0)
        first_val = store.read_log("fl_rounds")[0][1]["global"]["val_accuracy"]
        assert outcome.global_metrics["val_accuracy"] < first_val  # the last round made it worse
        assert outcome.global_metrics["kept_round"] == 1 and c.kept_round == 1
        assert outcome.global_metrics["kept_accuracy"] == store.read_log("fl_rounds")[0][1]["global"]["accuracy"]
        assert outcome.global_metrics["kept_accuracy"] > outcome.global_metrics["accuracy"]
        kept = {k: v.copy() for k, v in c.kept_weights.items()}
    with MetaStore(db) as store:
        resumed = Coordinator(config, store)
        assert resumed.kept_round == 1 and all(np.array_equal(kept[k], resumed.kept_weights[k]) for k in kept)
        assert not all(np.array_equal(kept[k], resumed.weights[k]) for k in kept)  # training goes on from the last


def test_consumers_that_are_not_connected_are_not_charged():
    config = JobConfig(strategy="tiff", rounds=1, per_round=2, data=DataSpec(num_clients=3, seed=1))
    with MetaStore(":memory:") as store:
        c = Coordinator(config, store)
        for cid in range(3):
            c.register(cid, {"num_samples": c.partition_sizes[cid], "local_only_accuracy": 0.5})
        c.begin_round([0, 1], now=0.0)  # client 2 is registered but gone
        c.finish_round(1.0)
        prices = c.ledger.totals_by("price", side="payer")
    assert set(prices) == {client_account(0), client_account(1)}


def test_trusted_selection_skips_distrusted_clients_and_covers_every_trusted_one():
    selector = TrustedRandomSelector(SelectionConfig(epsilon=0.0, epsilon_min=0.0))
    reports = {cid: ClientReport(cid, {"quality": 0.9}, verified_quality=0.2 + 0.05 * cid) for cid in range(8)}
    reports |= {8: ClientReport(8, {"quality": 0.99}, "rejected", "points away"),  # a flip and a low scorer
                9: ClientReport(9, {"quality": 0.99}, verified_quality=0.01)}
    selector.observe(RoundOutcome(1, list(range(10)), reports))
    picks = [selector.select(t, range(12), 4, random.Random(t)) for t in range(2, 40)]
    chosen = {c for p in picks for c in p}
    assert 8 not in chosen and 9 not in chosen
    assert chosen == set(range(8)) | {10, 11}  # every trusted client (unseen 10 and 11 too), not only the best
    counts = [sum(c in p for p in picks) for c in range(8)]
    assert min(counts) >= 0.4 * max(counts)  # uniform among the trusted, not greedy by score
