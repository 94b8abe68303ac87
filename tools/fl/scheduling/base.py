"""What every heterogeneity-aware scheduler tracks, behind the project's Selector interface.

`observe` turns each round's reports into: a latency EMA and a tier per client (tiering.py),
participation counts and client CPU-seconds, the latest accuracy per client, per-tier accuracy
(the mean of its members' latest accuracies) with its slope, the round each client's accuracy was
reported in (its staleness), and the global accuracy for the
plateau detector. Selection is left to subclasses. Everything is plain data in `state_dict`, so a
restarted server resumes with the same memory; randomness comes only from `select`'s rng.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mlsyskit.core.config import require
from mlsyskit.tools.fl.outcome import RoundOutcome
from mlsyskit.tools.fl.scheduling.metrics import jain_index
from mlsyskit.tools.fl.scheduling.signals import signals
from mlsyskit.tools.fl.scheduling.tiering import LatencyTiers, round_deadline
from mlsyskit.tools.fl.scheduling.trend import PLATEAU_RULES, PlateauDetector, TierAccuracy
from mlsyskit.tools.fl.selection.base import Selector


@dataclass(frozen=True)
class TrackingConfig:
    num_tiers: int = 5
    latency_ema_beta: float = 0.5
    retier_every: int = 10
    drift_fraction: float = 0.1
    trend_window: int = 5
    # adaptive's trigger (trend.PlateauDetector): the best of the last 5 rounds beats the best before by < 0.005.
    # "mean" over 10-round windows stops it firing on MNIST-1D's noisy climb (tuning seeds 0-2: 194 -> 133 s to
    # target) but shifts later on synthetic, where the early shift to rfair wins (seeds 0 and 2: 210 -> 408 s and
    # 112 -> 235 s): not adopted (issue 21 item 8, README)
    plateau_window: int = 5
    plateau_min_gain: float = 0.005
    plateau_rule: str = "best"
    deadline_slack: float = 1.5  # x the slowest expected latency among the selected
    fallback_deadline_s: float = 600.0  # for a round of unprofiled clients only
    # True: explored (unprofiled) clients do not stretch the deadline. Off: on the bench's seeds 0-1 it
    # cut rounds so short that 32-49% of fast's client CPU was wasted and accuracy fell (docs/fl-scheduling.md)
    deadline_profiled_only: bool = False

    def __post_init__(self) -> None:
        require(self.num_tiers >= 1 and self.retier_every >= 1, "num_tiers and retier_every must be >= 1")
        require(self.trend_window >= 2 and self.plateau_window >= 1, "trend_window >= 2, plateau_window >= 1")
        require(self.plateau_rule in PLATEAU_RULES, f"plateau_rule must be one of {PLATEAU_RULES}")


class TrackingScheduler(Selector):
    name = "tracking"

    def __init__(self, config: Any = None, tracking: TrackingConfig | None = None) -> None:
        super().__init__(config)
        self.tracking = tracking or TrackingConfig()
        t = self.tracking
        self.tiers = LatencyTiers(t.num_tiers, t.latency_ema_beta, t.retier_every, t.drift_fraction)
        self.tier_accuracy = TierAccuracy(t.trend_window)
        self.plateau = PlateauDetector(t.plateau_window, t.plateau_min_gain, t.plateau_rule)
        self.participation: dict[int, int] = {}
        self.cpu_s: dict[int, float] = {}
        self.accuracy: dict[int, float] = {}
        self.accuracy_round: dict[int, int] = {}  # the round each client's accuracy was reported in
        self.latest_round = 0
        self.seen: set[int] = set()  # every client ever offered as available: the fairness population
        self.registered_samples: dict[int, int] = {}  # sample counts clients registered with (register_clients)

    # --- selection helpers -------------------------------------------------------------------------
    def offer(self, available: Sequence[int]) -> list[int]:
        """The available ids, sorted and remembered as part of the population."""
        ids = sorted(set(available))
        self.seen.update(ids)
        return ids

    def round_deadline(self, selected: Sequence[int]) -> float:
        t = self.tracking
        return round_deadline((self.tiers.expected_latency(c) for c in selected), t.deadline_slack,
                              t.fallback_deadline_s, t.deadline_profiled_only)

    def participation_jain(self) -> float:
        return jain_index(self.participation.get(c, 0) for c in self.seen)

    def tier_accuracies(self) -> dict[int, float]:
        return {t: a for t in range(self.tracking.num_tiers) if (a := self.tier_accuracy.accuracy(t)) is not None}

    def register_clients(self, samples: Mapping[int, int]) -> None:
        self.registered_samples.update((c, n) for c, n in samples.items() if n > 0)

    # --- learning ----------------------------------------------------------------------------------
    def observe(self, outcome: RoundOutcome) -> None:
        self.latest_round = max(self.latest_round, outcome.round)
        for cid in outcome.selected:
            self.participation[cid] = self.participation.get(cid, 0) + 1
        for s in signals(outcome):
            if s.latency_s is not None:
                self.tiers.observe(s.client_id, s.latency_s)
            self.cpu_s[s.client_id] = self.cpu_s.get(s.client_id, 0.0) + s.cpu_s
            if s.accuracy is not None:
                self.accuracy[s.client_id] = s.accuracy
                self.accuracy_round[s.client_id] = outcome.round
        self.tiers.maybe_retier(outcome.round)
        members: dict[int, list[float]] = {}
        for cid, accuracy in self.accuracy.items():
            tier = self.tiers.tier_of(cid)
            if tier is not None:
                members.setdefault(tier, []).append(accuracy)
        for tier, values in sorted(members.items()):
            self.tier_accuracy.record(outcome.round, tier, sum(values) / len(values))
        if "accuracy" in outcome.global_metrics:
            self.plateau.record(float(outcome.global_metrics["accuracy"]))

    def state_dict(self) -> dict[str, Any]:
        return {"tiers": self.tiers.state_dict(), "tier_accuracy": self.tier_accuracy.state_dict(),
                "plateau": self.plateau.state_dict(),
                "participation": {str(k): v for k, v in self.participation.items()},
                "cpu_s": {str(k): v for k, v in self.cpu_s.items()},
                "accuracy": {str(k): v for k, v in self.accuracy.items()},
                "accuracy_round": {str(k): v for k, v in self.accuracy_round.items()},
                "latest_round": self.latest_round, "seen": sorted(self.seen)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tiers.load_state_dict(state["tiers"])
        self.tier_accuracy.load_state_dict(state["tier_accuracy"])
        self.plateau.load_state_dict(state["plateau"])
        self.participation = {int(k): int(v) for k, v in state["participation"].items()}
        self.cpu_s = {int(k): float(v) for k, v in state["cpu_s"].items()}
        self.accuracy = {int(k): float(v) for k, v in state["accuracy"].items()}
        # runs saved before per-client staleness was tracked: their accuracies count as fresh
        self.latest_round = int(state.get("latest_round", 0))
        self.accuracy_round = {int(k): int(v) for k, v in state.get("accuracy_round", {}).items()}
        for cid in self.accuracy:
            self.accuracy_round.setdefault(cid, self.latest_round)
        self.seen = {int(c) for c in state["seen"]}
