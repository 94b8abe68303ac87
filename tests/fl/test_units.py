"""FL building blocks: partitions, validation, FedAvg, selectors, ledger and the two economies."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest

from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.fl.aggregation import fedavg, validate_update
from mlsyskit.tools.fl.config import DataSpec, EconomyConfig, JobConfig, SelectionConfig
from mlsyskit.tools.fl.data import load_federated
from mlsyskit.tools.fl.incentive.equal_pay import EqualPay
from mlsyskit.tools.fl.incentive.ledger import (
    ESCROW,
    MINT,
    POOL,
    Ledger,
    Transfer,
    add_exactly,
    client_account,
)
from mlsyskit.tools.fl.incentive.tiff_tokens import TiffTokens
from mlsyskit.tools.fl.outcome import ClientReport, RoundOutcome
from mlsyskit.tools.fl.selection.quality_greedy import QualityGreedySelector
from mlsyskit.tools.fl.selection.random_pick import RandomSelector
from mlsyskit.tools.fl.strategy import STRATEGIES
from mlsyskit.tools.fl.training import poisoned_labels, train_local


@pytest.mark.parametrize("partition", ["iid", "dirichlet", "shards"])
def test_partitions_cover_the_pool_once_and_are_deterministic(partition):
    spec = DataSpec(dataset="digits", num_clients=20, partition=partition, alpha=0.3, seed=3)
    data = load_federated(spec)
    total = sum(len(c.y_train) + len(c.y_test) for c in data.clients) + len(data.y_test) + len(data.y_val)
    assert total == 1797  # every digit image is in exactly one place (the server's validation split too)
    assert abs(len(data.y_val) - len(data.y_test)) <= 1
    assert all(c.num_samples >= 3 for c in data.clients)
    again = load_federated(DataSpec(dataset="digits", num_clients=20, partition=partition, alpha=0.3, seed=3))
    assert all(np.array_equal(a.y_train, b.y_train) for a, b in zip(data.clients, again.clients, strict=True))


def test_dirichlet_skews_labels_more_than_iid():
    def mean_classes(partition):
        data = load_federated(DataSpec(num_clients=20, partition=partition, alpha=0.1, seed=1))
        return np.mean([len(np.unique(c.y_train)) for c in data.clients])

    assert mean_classes("dirichlet") < 0.7 * mean_classes("iid")


def test_mnist1d_and_synthetic_load(monkeypatch):
    import mnist1d.data

    default_args = mnist1d.data.get_dataset_args

    def fewer_samples():  # MNIST-1D's own generator, 500 of its 5,000 samples (5.7 CPU s for all of them)
        args = default_args()
        args.num_samples = 500
        return args

    monkeypatch.setattr(mnist1d.data, "get_dataset_args", fewer_samples)
    m = load_federated(DataSpec(dataset="mnist1d", num_clients=5, seed=0))
    assert m.num_features == 40 and m.num_classes == 10 and len(m.clients) == 5
    s = load_federated(DataSpec(dataset="synthetic", num_clients=5, seed=0))
    assert s.num_features == 60 and all(c.num_samples > 0 for c in s.clients)


def test_label_flip_and_noise():
    y = np.arange(10, dtype=np.int64)
    assert poisoned_labels(y, "label-flip", 10, np.random.default_rng(0)).tolist() == list(range(9, -1, -1))
    noisy = poisoned_labels(np.zeros(1000, dtype=np.int64), "noisy-labels", 10, np.random.default_rng(0))
    assert 0.6 < (noisy != 0).mean() < 0.8  # 80% replaced, 1/10 of those by the same label


def test_validation_rejects_bad_updates():
    ref = {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)}
    good = {"num_samples": 5, "loss": 0.1, "quality": 0.9, "train_time_s": 0.1, "cpu_time_s": 0.1}
    assert validate_update({k: v.copy() for k, v in ref.items()}, good, ref, 1 << 20) is None
    assert "shape" in validate_update({"w": np.zeros((3, 2), np.float32), "b": ref["b"]}, good, ref, 1 << 20)
    assert "names" in validate_update({"w": ref["w"]}, good, ref, 1 << 20)
    nan = {"w": np.full((2, 3), np.nan, np.float32), "b": ref["b"]}
    assert "NaN" in validate_update(nan, good, ref, 1 << 20)
    assert "exceeds" in validate_update(ref, good, ref, 10)
    # an oversized update is refused for its size, even with other names or shapes
    assert "exceeds the 1024-byte limit" in validate_update({"w": np.zeros(4096, np.float32)}, good, ref, 1024)
    assert "quality" in validate_update(ref, good | {"quality": 1.5}, ref, 1 << 20)
    assert "num_samples" in validate_update(ref, good | {"num_samples": "x"}, ref, 1 << 20)
    assert "weights map" in validate_update(b"junk", good, ref, 1 << 20)


def test_fedavg_is_sample_weighted():
    a, b = {"w": np.ones(3, np.float32)}, {"w": np.full(3, 4.0, np.float32)}
    assert fedavg([(a, 1), (b, 2)])["w"].tolist() == [3.0, 3.0, 3.0]


def test_random_selector_is_seeded():
    s = RandomSelector(SelectionConfig())
    assert s.select(1, range(20), 5, random.Random(1)) == s.select(1, range(20), 5, random.Random(1))
    assert len(set(s.select(1, range(20), 5, random.Random(2)))) == 5


def test_quality_greedy_tries_unseen_then_exploits_with_exploration():
    cfg = SelectionConfig(epsilon=0.5, epsilon_decay=0.5, epsilon_min=0.0)
    sel = QualityGreedySelector(cfg)
    assert sel.epsilon(1) == 0.5 and sel.epsilon(3) == 0.125
    outcome = RoundOutcome(1, [0, 1, 2, 3], {i: ClientReport(i, {"quality": 0.1 * i}) for i in range(4)})
    sel.observe(outcome)
    # 4 and 5 were never seen: optimistic, so they are picked first; then the best seen (3)
    greedy = QualityGreedySelector(SelectionConfig(epsilon=0.0, epsilon_min=0.0))
    greedy.load_state_dict(sel.state_dict())
    assert greedy.select(2, range(6), 3, random.Random(0)) == [3, 4, 5]
    # with exploration, low-quality clients are still picked sometimes
    explorer = QualityGreedySelector(SelectionConfig(epsilon=1.0, epsilon_decay=1.0, epsilon_min=1.0))
    explorer.load_state_dict(sel.state_dict())
    picks = [c for seed in range(50) for c in explorer.select(2, range(6), 2, random.Random(seed))]
    assert 0 in picks and 1 in picks


def test_ledger_is_double_entry_and_conserved(tmp_path):
    with MetaStore(tmp_path / "l.db") as store:
        ledger = Ledger(store)
        ledger.apply(0, [Transfer(MINT, client_account(i), 100.0, "endowment") for i in range(3)])
        ledger.apply(1, [Transfer(client_account(0), ESCROW, 1 / 3, "price"), Transfer(ESCROW, POOL, 1 / 3, "x")])
        assert abs(ledger.total()) < 1e-12
        assert ledger.balance(MINT) == -300.0 and ledger.balance(POOL) == pytest.approx(1 / 3)
        with pytest.raises(ValueError, match="refusing transfer"):
            ledger.apply(2, [Transfer(MINT, POOL, float("nan"), "bad")])
        digest = ledger.digest()
    with MetaStore(tmp_path / "l.db") as store:  # durable and identical after reopening
        assert Ledger(store).digest() == digest


def test_ledger_balances_follow_rollbacks_and_other_writers(tmp_path):
    """Balances are read incrementally; a rolled-back round and rows from another Ledger show exactly."""
    with MetaStore(tmp_path / "l.db") as store:
        ledger = Ledger(store)
        ledger.apply(0, [Transfer(MINT, client_account(0), 10.0, "endowment")])
        assert ledger.balances() == {MINT: -10.0, client_account(0): 10.0}
        with pytest.raises(RuntimeError), store.transaction():
            ledger.apply(1, [Transfer(client_account(0), POOL, 3.0, "price")])
            assert ledger.balance(POOL) == 3.0  # seen inside the transaction
            raise RuntimeError("round failed")
        assert ledger.balances() == {MINT: -10.0, client_account(0): 10.0}
        ledger.apply(1, [Transfer(client_account(0), ESCROW, 2.0, "price")])  # reuses the rolled-back seq
        Ledger(store).apply(1, [Transfer(ESCROW, POOL, 0.5, "fee")])
        expected = {MINT: -10.0, client_account(0): 8.0, ESCROW: 1.5, POOL: 0.5}
        assert ledger.balances() == expected == Ledger(store).balances()


def test_ledger_running_partials_give_fsum_over_every_row():
    """The kept partials stay a few floats and their fsum is bit-identical to fsum over every amount."""
    rng = np.random.default_rng(7)
    values = np.concatenate([rng.uniform(-1, 1, 3000) * 10.0 ** rng.integers(-8, 8, 3000), [1e16, 1.0, -1e16]])
    partials: list[float] = []
    for i, v in enumerate(values.tolist()):
        add_exactly(partials, v)
        if i % 97 == 0 or i == len(values) - 1:
            assert math.fsum(partials) == math.fsum(values[: i + 1].tolist())
    assert len(partials) <= 40


def _outcome():
    reports = {0: ClientReport(0, {"quality": 0.9, "num_samples": 10}),
               1: ClientReport(1, {"quality": 0.8, "num_samples": 20}),
               2: ClientReport(2, {"quality": 0.1, "num_samples": 10}),  # under the floor
               3: ClientReport(3, {}, "failed", "deadline")}
    return RoundOutcome(1, [0, 1, 2, 3], reports)


def test_tiff_pays_by_quality_and_forfeits_bad_slots():
    tiff = TiffTokens(EconomyConfig(quality_exponent=2.0, quality_floor=0.5))
    transfers = tiff.pay_providers(_outcome(), pot=8.0)
    pay = {t.payee: t.amount for t in transfers if t.kind == "pay"}
    assert set(pay) == {client_account(0), client_account(1)}
    # two paid slots of 8/4 = 2 each, shared by n * q^2: 10 * 0.81 vs 20 * 0.64
    assert pay[client_account(0)] == pytest.approx(4.0 * 8.1 / (8.1 + 12.8))
    assert sum(pay.values()) == pytest.approx(4.0)
    assert [t.amount for t in transfers if t.kind == "forfeit"] == [pytest.approx(4.0)]


def test_equal_pay_pays_every_valid_provider_the_same():
    transfers = EqualPay(EconomyConfig()).pay_providers(_outcome(), pot=9.0)
    assert sorted(t.amount for t in transfers) == [3.0, 3.0, 3.0]


def test_reimbursement_favours_consumers_who_gained_less():
    tiff = TiffTokens(EconomyConfig())
    refunds = {t.payee: t.amount for t in tiff.reimburse(6.0, {0: 10.0, 1: 10.0}, {0: 0.0, 1: 1.0})}
    assert refunds[client_account(0)] == pytest.approx(4.0) and refunds[client_account(1)] == pytest.approx(2.0)
    capped = {t.payee: t.amount for t in tiff.reimburse(100.0, {0: 1.0}, {0: 0.0})}
    assert capped[client_account(0)] == 1.0  # never more than was paid
    # the shares never add up to more than the pool, float rounding included (it used to overdraw by ~1e-16)
    rng = random.Random(0)
    for _ in range(2000):
        paid = {i: rng.choice([1.0, 2.0, rng.random() * 10]) for i in range(rng.randint(1, 30))}
        forfeits = [rng.uniform(0, 3) for _ in range(rng.randint(1, 20))]  # the pool's rows, as the ledger sums them
        refunds = tiff.reimburse(math.fsum(forfeits), paid, {i: rng.uniform(-1, 1) for i in paid})
        assert math.fsum(forfeits + [-t.amount for t in refunds]) >= 0 and all(t.amount >= 0 for t in refunds)


def test_registry_and_config_errors():
    assert {"fedavg", "tiff", "median", "tiff+median"} <= set(STRATEGIES.names())  # and the other robust rules
    with pytest.raises(ValueError, match="unknown strategy 'nope'; choose from fedadam, fedavg, .*tiff"):
        STRATEGIES.get("nope")
    from mlsyskit.core.config import ConfigError

    with pytest.raises(ConfigError, match="per_round"):
        JobConfig(per_round=20, data=DataSpec(num_clients=10))


def test_quality_is_the_received_models_accuracy_on_training_data_and_flippers_score_low():
    """TIFF's signal is read from the first epoch's forward passes, all on the unchanged global model."""
    from mlsyskit.tools.fl.config import TrainSpec
    from mlsyskit.tools.fl.model import evaluate, init_weights

    data = load_federated(DataSpec(num_clients=4, partition="iid", seed=0))
    spec = TrainSpec(epochs=3)
    weights = init_weights(data.num_features, data.num_classes, spec.hidden, seed=0)
    for round_seed in range(3):  # a few rounds of centralised-ish training so the global model is good
        weights = train_local(weights, data.clients[0], spec, data.num_features, data.num_classes, round_seed).weights
    client = data.clients[1]
    honest = train_local(weights, client, spec, data.num_features, data.num_classes, seed=7)
    flipper = train_local(weights, client, spec, data.num_features, data.num_classes, seed=7, attack="label-flip")
    flipped = data.num_classes - 1 - client.y_train
    assert honest.quality == pytest.approx(evaluate(weights, client.x_train, client.y_train)["accuracy"], abs=1e-9)
    assert flipper.quality == pytest.approx(evaluate(weights, client.x_train, flipped)["accuracy"], abs=1e-9)
    assert honest.quality > 0.8 and flipper.quality < 0.2
    assert honest.consumer_accuracy == pytest.approx(evaluate(weights, client.x_test, client.y_test)["accuracy"])


def test_coordinator_rejects_a_claimed_sample_count_that_is_not_the_partition_size():
    from mlsyskit.tools.fl.coordinator import Coordinator

    config = JobConfig(rounds=1, per_round=2, data=DataSpec(num_clients=2, seed=5))
    with MetaStore(":memory:") as store:
        c = Coordinator(config, store)
        for cid in (0, 1):
            c.register(cid, {"num_samples": c.partition_sizes[cid], "local_only_accuracy": 0.5})
        plan = c.begin_round([0, 1], now=0.0)
        data = load_federated(config.data)
        update = train_local(plan.weights, data.clients[1], config.train, data.num_features, data.num_classes,
                             plan.seeds[1]).weights  # a real update: TIFF refuses unchanged weights
        metrics = {"loss": 0.1, "quality": 0.9, "train_time_s": 0.1, "cpu_time_s": 0.1}
        accepted, reason = c.submit(0, 1, update, metrics | {"num_samples": 10 * c.partition_sizes[0]})
        assert not accepted and "partition size" in reason
        assert c.submit(1, 1, update, metrics | {"num_samples": c.partition_sizes[1]}) == (True, "")
        outcome = c.finish_round(1.0)
    assert outcome.reports[0].status == "rejected" and outcome.reports[1].status == "valid"
