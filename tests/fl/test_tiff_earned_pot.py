"""TIFF's pot goes to verified work: refused and under-floor slots are shared by the paid providers once quality
decides pay, undelivered slots too, and before the model beats chance the paid providers share the
delivered pot equally and the floor is the selector's trust bar. Selection walks FedAvg's random order, so the two pick the same
clients while nobody is distrusted."""
from __future__ import annotations

import math
import random

import pytest

from mlsyskit.tools.fl.config import EconomyConfig, SelectionConfig
from mlsyskit.tools.fl.incentive.earned_pot import EarnedPot
from mlsyskit.tools.fl.incentive.ledger import ESCROW, POOL, client_account
from mlsyskit.tools.fl.incentive.tiff_tokens import PRE_CHANCE_FLOOR, TiffTokens, quality_threshold
from mlsyskit.tools.fl.outcome import ClientReport, RoundOutcome
from mlsyskit.tools.fl.selection.random_pick import RandomSelector
from mlsyskit.tools.fl.selection.trusted_random import TrustedRandomSelector

ECONOMY = EconomyConfig(quality_exponent=2.0, quality_floor=0.25)


def report(cid: int, quality: float | None, status: str = "valid", samples: int = 10) -> ClientReport:
    return ClientReport(cid, {"quality": 0.99, "num_samples": samples}, status, verified_quality=quality)


def round_of(reports: list[ClientReport], pay_by_quality: bool = True) -> RoundOutcome:
    return RoundOutcome(1, [r.client_id for r in reports], {r.client_id: r for r in reports},
                        pay_by_quality=pay_by_quality)


def pays(transfers) -> dict[str, float]:
    return {t.payee: t.amount for t in transfers if t.kind == "pay"}


def forfeit(transfers) -> float:
    return math.fsum(t.amount for t in transfers if t.kind == "forfeit" and t.payee == POOL)


def test_refused_under_floor_and_undelivered_slots_go_to_the_verified_providers():
    # 0, 1 verified; 2 under the floor (0.25 x median 0.4 = 0.1); 3 refused (a sign-flip); 4 never delivered
    outcome = round_of([report(0, 0.6), report(1, 0.4, samples=20), report(2, 0.05), report(3, None, "rejected"),
                        report(4, None, "failed")])
    transfers = EarnedPot(ECONOMY).pay_providers(outcome, pot=10.0)
    pay = pays(transfers)
    assert set(pay) == {client_account(0), client_account(1)}
    # the whole pot (FedAvg's equal pay also gives the failed provider's slot to those who delivered) is shared
    # by n * q^2: 10 * 0.36 = 3.6 vs 20 * 0.16 = 3.2
    assert pay[client_account(0)] == pytest.approx(10.0 * 3.6 / 6.8)
    assert pay[client_account(1)] == pytest.approx(10.0 * 3.2 / 6.8)
    assert forfeit(transfers) == pytest.approx(0.0)
    assert math.fsum(t.amount for t in transfers if t.payer == ESCROW) == pytest.approx(10.0)  # escrow ends empty
    # the slot rule it replaces gave the two verified providers 4 and forfeited 6
    assert sum(pays(TiffTokens(ECONOMY).pay_providers(outcome, pot=10.0)).values()) == pytest.approx(4.0)


def test_attackers_refused_do_not_lower_honest_pay_and_earn_nothing():
    """Three attackers refused, two honest verified: the honest pair is paid the attackers' slots too, and an
    attacker that scrapes over the floor with a weak update earns only its q^2 share."""
    honest = [report(0, 0.5), report(1, 0.45)]
    refused = [report(c, None, "rejected") for c in (2, 3, 4)]
    transfers = EarnedPot(ECONOMY).pay_providers(round_of(honest + refused), pot=10.0)
    assert sum(pays(transfers).values()) == pytest.approx(10.0) and forfeit(transfers) == pytest.approx(0.0)
    weak = EarnedPot(ECONOMY).pay_providers(round_of(honest + [report(2, 0.12)] + refused[1:]), pot=10.0)
    share = pays(weak)
    assert share[client_account(2)] <= 0.10 * share[client_account(0)]  # 0.12^2 / 0.5^2 = 0.058


def test_no_verified_update_sends_the_whole_pot_to_the_pool():
    outcome = round_of([report(0, None, "rejected"), report(1, 0.0), report(2, None, "failed")])
    transfers = EarnedPot(ECONOMY).pay_providers(outcome, pot=7.0)
    assert pays(transfers) == {} and forfeit(transfers) == pytest.approx(7.0)


def test_before_chance_the_paid_providers_share_the_delivered_pot_equally_and_the_floor_is_the_trust_bar():
    # median 0.4: the floor is PRE_CHANCE_FLOOR x 0.4 = 0.2 before chance (0.1 after), so the 0.12 update
    # (a quality liar's 20% true labels scored about that, tests/fl/test_pay_verified.py) is not paid
    reports = [report(0, 0.5), report(1, 0.4), report(2, 0.12), report(3, None, "rejected")]
    before = round_of(reports, pay_by_quality=False)
    assert quality_threshold(before, ECONOMY.quality_floor) == pytest.approx(PRE_CHANCE_FLOOR * 0.4)
    assert quality_threshold(round_of(reports), ECONOMY.quality_floor) == pytest.approx(0.25 * 0.4)
    transfers = EarnedPot(ECONOMY).pay_providers(before, pot=8.0)
    # all four delivered: the whole pot goes to the two paid, equally (one slot each and the forfeited slots used to
    # refund consumers, which cost honest providers 0-12.5% of FedAvg's pay on MNIST-1D without any attacker)
    assert pays(transfers) == {client_account(0): pytest.approx(4.0), client_account(1): pytest.approx(4.0)}
    assert forfeit(transfers) == pytest.approx(0.0)
    failed = round_of(reports[:3] + [report(3, None, "failed")], pay_by_quality=False)
    transfers = EarnedPot(ECONOMY).pay_providers(failed, pot=8.0)  # an undelivered slot too
    assert pays(transfers) == {client_account(0): pytest.approx(4.0), client_account(1): pytest.approx(4.0)}
    assert forfeit(transfers) == pytest.approx(0.0)


def test_trusted_selection_is_fedavgs_selection_while_nobody_is_distrusted():
    trusted = TrustedRandomSelector(SelectionConfig())
    fedavg = RandomSelector(SelectionConfig())
    for clients, k in ((20, 5), (100, 10), (7, 7)):
        for seed in range(30):
            assert trusted.select(seed + 1, range(clients), k, random.Random(seed)) == \
                fedavg.select(seed + 1, range(clients), k, random.Random(seed))


def test_distrusted_clients_are_skipped_for_the_next_in_fedavgs_order_unless_explored():
    no_exploring = TrustedRandomSelector(SelectionConfig(epsilon=0.0, epsilon_min=0.0))
    seen = {c: ClientReport(c, {"quality": 0.9}, verified_quality=0.4) for c in range(10)}
    seen[3] = ClientReport(3, {"quality": 0.99}, "rejected", "points away")
    no_exploring.observe(RoundOutcome(1, list(range(10)), seen))
    fedavg = RandomSelector(SelectionConfig())
    replaced = 0
    for seed in range(40):
        picked = no_exploring.select(2, range(10), 4, random.Random(seed))
        order = random.Random(seed).sample(range(10), 10)  # the order FedAvg takes its first 4 from
        assert picked == sorted([c for c in order if c != 3][:4])
        replaced += 3 in fedavg.select(2, range(10), 4, random.Random(seed))
    assert replaced > 0  # FedAvg did pick client 3 in some rounds, so the skip was exercised
    always_exploring = TrustedRandomSelector(SelectionConfig(epsilon=1.0, epsilon_min=1.0))
    always_exploring.observe(RoundOutcome(1, list(range(10)), seen))
    for seed in range(10):  # with exploration probability 1 the distrusted client keeps its place
        assert always_exploring.select(2, range(10), 4, random.Random(seed)) == \
            fedavg.select(2, range(10), 4, random.Random(seed))
