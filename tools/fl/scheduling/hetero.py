"""Ours: the heterogeneity-aware adaptive scheduler, knobs as presets or free weights.

From the BigData'22 abstract: adapt selection to the accuracy trend and to each client's
changing resources and availability, with knobs for resource-efficient fast training, resource
fairness, accuracy fairness and model performance. Its scoring is not public; this one is ours
(docs/fl-scheduling.md). Each available client i in tier t(i) gets five terms in [0, 1]:
  fast   min(1, L* / EMA latency of i), L* = the q-quantile (nearest rank) of the available
         profiled clients' EMA latencies, q = `fast_pool` x k / available clients: about the
         fast_pool x k fastest of the population tie at 1 and the random tie-break rotates among
         them, so fast training still covers that many clients' data (the profiled clients stand
         for the population; fast_pool 0: only the fastest scores 1)   (unprofiled: 0.5); with
         `fast_unit` "per-sample", EMA latency / the client's training samples instead of latency
         `fast_cutoff` "utility-rate" (adaptive's): L* = the latency whose k most useful clients no slower
         than it teach the most statistical utility per second of round (utility_rate.py)
  rfair  1 - (0.75 participation_i / max + 0.25 cpu_s_i / max)        (maxima over the population;
         0.25 is `rfair_cpu_share`: equal CPU-seconds means fast clients take part more often, so
         the two goals pull apart and participation gets the larger share)
  afair  (1 - s) x tier term + s x client term, s = `afair_client_share`:
         tier term   (best tier accuracy - accuracy of t(i)) / (best - worst)     (unknown: 0.5)
         client term 0.5 + (raw_i - 0.5) x decay^age_i, raw_i = (best client accuracy - acc_i) /
                     (best - worst) over every client's latest reported accuracy, age_i = rounds
                     since i reported it, decay = `afair_staleness_decay`: an old reading says
                     less about the current model, so it fades to the unknown value   (unknown: 0.5)
  perf   normalised gain of t(i): EMA of the global accuracy change of rounds it took part in,
         weighted by its share of the round                            (unknown: 0.5)
  util   Oort's statistical utility, min(U_i, cap) / cap, U_i = samples_i x sqrt(mean loss^2) from i's
         latest on-time update, cap = the `util_clip` percentile of the known clients' U (as Oort's
         code clips): a client with much data the model still gets wrong   (unknown: 0.5)
score_i = sum of weight x term; the top k by score are chosen, except ceil(`explore` x k) slots drawn
at random (unprofiled clients first), so new and changed clients get measured. Ties are broken
by a per-round random key; clients never selected share one score (FRESH_TERMS) and rank after
known clients of equal score, in random order. `adaptive` starts as `fast` (utility-rate cut-off); each time the plateau detector fires (at
most once per plateau window) it moves `shift` of the weight from fast (or, once fast is spent,
half of that from the largest other knob) to: rfair if participation Jain's index is below
`rfair_target` (and rfair has < 0.5), else afair if the tier accuracy gap exceeds `afair_gap`,
else perf. `fast_floor` of the weight always stays on fast (the shifts move only the rest), and (adaptive's
`slow_penalty`) afair's term of a client slower than fast's L* is scaled by L* / its latency, as Oort's duration
penalty scales utility.
"""
from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mlsyskit.core.config import require
from mlsyskit.core.telemetry import percentile
from mlsyskit.tools.fl.outcome import RoundOutcome
from mlsyskit.tools.fl.scheduling.base import TrackingConfig, TrackingScheduler
from mlsyskit.tools.fl.scheduling.oort import EXPLORE_BY, explore_by_size, weighted_sample
from mlsyskit.tools.fl.scheduling.signals import signals
from mlsyskit.tools.fl.scheduling.utility_rate import utility_rate_cutoff

KNOBS = ("fast", "rfair", "afair", "perf", "util")
FRESH_TERMS = {"fast": 0.5, "rfair": 1.0, "afair": 0.5, "perf": 0.5, "util": 0.5}  # never selected, never measured
PRESETS: dict[str, dict[str, float]] = {
    "fast": {"fast": 1.0},
    "rfair": {"rfair": 1.0},
    "afair": {"afair": 0.8, "fast": 0.2},
    "perf": {"perf": 0.8, "fast": 0.2},
    "adaptive": {"fast": 1.0},  # the start; it moves from there
}
# (fast_pool, TrackingConfig.deadline_profiled_only) per preset, chosen on bench_fl_sched's seeds 0-1
# (synthetic, 100 clients, 10/round, 600 s; docs/fl-scheduling.md "Round 3"): fast by time to target,
# afair by per-client accuracy spread, adaptive by time to target. Others: not tuned.
PRESET_TUNED: dict[str, tuple[float, bool]] = {"afair": (3.0, True), "adaptive": (0.0, True)}
FAST_UNITS = ("latency", "per-sample")
UTIL_PRIORS = ("median", "size")
EXPLORE_WINDOW = 5.0  # explore_by "size": among the 5 x n largest unprofiled clients (FedScale's sample_window)
FAST_CUTOFFS = ("pool", "utility-rate")  # fast's L*: the fast_pool quantile, or utility_rate.py's cut-off
# adaptive's fast takes every client within the latency that buys the most statistical utility per second: by plain
# latency it trained the clients with the least data and lost to Oort on MNIST-1D (issue 21 item 8; chosen on
# bench_fl_sched's tuning seeds 0-2, README). Others: the fast_pool quantile.
PRESET_FAST_CUTOFF = {"adaptive": "utility-rate"}
# adaptive's afair scores a client slower than fast's L* down by L* / its latency (HeteroConfig.slow_penalty): after
# the plateau shifts afair kept choosing the worst-served clients, on MNIST-1D slow devices (2 s rounds against Oort's
# 0.9 s). Chosen on bench_fl_sched's seeds 0-10 (issue 21 item 8, README: MNIST-1D 7 of 7 seeds before Oort, synthetic
# 3 of 6; without it 3 of 7 and 5 of 6); then run once on fresh seeds. Others: no penalty.
PRESET_SLOW_PENALTY = {"adaptive": 1.0}
# What `fast` ranks by (HeteroConfig.fast_unit, default "latency"): round latency, or latency per training sample. A client's
# compute time grows with its data, so by latency a fast round also trains the clients with the least data (on
# MNIST-1D, Dirichlet 0.3, adaptive's rounds 2-40 took clients of 23 samples on average against 32); per sample,
# the same device and link are as fast whatever data they hold. No preset uses it: for adaptive it halved the
# time to target on MNIST-1D seed 0, and was 1.6x slower on seed 1 and 1.4x on synthetic seed 0 (README,
# issue 21 item 8; docs/results/bench_fl_sched_variants.jsonl).


@dataclass(frozen=True)
class HeteroConfig:
    preset: str = "adaptive"
    weights: dict[str, float] = field(default_factory=dict)  # free weights; override the preset's
    explore: float = 0.1
    temperature: float = 0.0  # > 0: sample by weight exp(score / T) instead of taking the top scores
    gain_beta: float = 0.3  # EMA weight of a round's accuracy change in a tier's gain
    shift: float = 0.25  # adaptive: weight moved per adjustment
    afair_gap: float = 0.05  # adaptive: tier accuracy gap that makes fairness the target
    rfair_target: float = 0.5  # adaptive: participation Jain's index below which rfair gets weight
    rfair_cpu_share: float = 0.25  # rfair: weight of CPU-seconds against participation counts
    # fast: how many times k of the fastest clients count as equally fast; None: the preset's (PRESET_TUNED)
    fast_pool: float | None = None
    afair_client_share: float = 0.7  # afair: weight of the client's own accuracy against its tier's
    afair_staleness_decay: float = 0.9  # afair: per round, how much of an accuracy reading's signal stays
    fast_unit: str = "latency"  # fast: "latency" or "per-sample" (latency / samples)
    fast_cutoff: str | None = None  # fast's L*: "pool" or "utility-rate"; None: the preset's (PRESET_FAST_CUTOFF)
    util_clip: float = 95.0  # util: percentile of the known clients' statistical utility taken as its cap
    # adaptive: plateau shifts leave fast at least this weight, so rounds stay short after the shifts to fairness.
    # With 0 every shift on MNIST-1D's noisy climb spent fast by round ~37 and rfair/afair then chose slow clients;
    # on the tuning seeds 0-2 0.25 took MNIST-1D's mean time to target 194 -> 143 s, synthetic 137 -> 137 s (0.5:
    # MNIST-1D 116 s, synthetic seed 0 never reached); issue 21 item 8, README
    fast_floor: float = 0.25
    explore_by: str = "random"  # explore slots: unprofiled clients uniformly, or "size" (Oort's FedScale rule)
    util_prior: str = "median"  # util of a client not measured yet: the median known, or "size" (its count x median)
    # > 0: the slow_knobs' terms of a client slower than fast's L* are scaled by (L* / its latency) ** this, as Oort
    # scales utility by its duration penalty: a slow client stretches everyone's round, so fairness picks it only
    # when its term outweighs the time it costs (0: the terms are added as they are); None: the preset's
    slow_penalty: float | None = None
    # True: a client drawn for an explore slot does not stretch the round's deadline; a slow one is measured late (as
    # deadline_profiled_only does for unprofiled clients), so a random draw cannot hold the whole round for its 50 s
    deadline_skips_explored: bool = False
    slow_knobs: tuple[str, ...] = ("afair",)  # the knobs slow_penalty applies to (all four: see README)
    slow_by: str = "latency"  # slow_penalty's measure: latency against L*, or "per-sample" (samples/s against the median)

    def __post_init__(self) -> None:
        require(self.preset in PRESETS, f"preset must be one of {', '.join(PRESETS)}")
        require(set(self.weights) <= set(KNOBS), f"weights may only name {', '.join(KNOBS)}")
        require(all(w >= 0 for w in self.weights.values()), "weights must be non-negative")
        require(0 <= self.explore <= 1 and 0 < self.gain_beta <= 1 and 0 < self.shift <= 1,
                "explore in [0, 1], gain_beta and shift in (0, 1]")
        require(0 <= self.rfair_cpu_share <= 1, "rfair_cpu_share must be in [0, 1]")
        require(0 <= self.afair_client_share <= 1 and 0 <= self.afair_staleness_decay <= 1,
                "afair_client_share and afair_staleness_decay must be in [0, 1]")
        require(self.temperature >= 0 and (self.fast_pool is None or self.fast_pool >= 0),
                "temperature and fast_pool must be >= 0")
        require(self.fast_unit in FAST_UNITS, f"fast_unit must be one of {FAST_UNITS}")
        require(0 < self.util_clip <= 100, "util_clip must be in (0, 100]")
        require(0 <= self.fast_floor <= 1 and self.penalty() >= 0, "fast_floor in [0, 1], slow_penalty >= 0")
        require(self.slow_by in FAST_UNITS, f"slow_by must be one of {FAST_UNITS}")
        require(set(self.slow_knobs) <= set(KNOBS[1:]), f"slow_knobs may only name {', '.join(KNOBS[1:])}")
        require(self.fast_cutoff in (None, *FAST_CUTOFFS), f"fast_cutoff must be one of {FAST_CUTOFFS}")
        require(self.explore_by in EXPLORE_BY and self.util_prior in UTIL_PRIORS,
                f"explore_by must be one of {EXPLORE_BY}, util_prior one of {UTIL_PRIORS}")
        require(self.fast_cutoff != "utility-rate" or self.fast_unit == "latency",
                "fast_cutoff 'utility-rate' compares round latencies: it needs fast_unit 'latency'")

    def pool(self) -> float:
        return PRESET_TUNED.get(self.preset, (0.0, False))[0] if self.fast_pool is None else self.fast_pool

    def penalty(self) -> float:
        return PRESET_SLOW_PENALTY.get(self.preset, 0.0) if self.slow_penalty is None else self.slow_penalty

    def cutoff(self) -> str:
        if self.fast_cutoff is not None:
            return self.fast_cutoff
        return PRESET_FAST_CUTOFF.get(self.preset, "pool") if self.fast_unit == "latency" else "pool"

    def initial_weights(self) -> dict[str, float]:
        chosen = dict(self.weights) if self.weights else dict(PRESETS[self.preset])
        total = sum(chosen.values())
        require(total > 0, "at least one weight must be positive")
        return {k: chosen.get(k, 0.0) / total for k in KNOBS}


def _normalise(values: dict[int, float]) -> dict[int, float]:
    if not values:
        return {}
    low, high = min(values.values()), max(values.values())
    return {k: (v - low) / (high - low) if high > low else 0.5 for k, v in values.items()}


class HeteroScheduler(TrackingScheduler):
    name = "hetero"
    preset = "adaptive"

    def __init__(self, config: HeteroConfig | None = None, tracking: TrackingConfig | None = None) -> None:
        config = config or HeteroConfig(preset=self.preset)
        profiled_only = PRESET_TUNED.get(config.preset, (0.0, False))[1]
        super().__init__(config, tracking or TrackingConfig(deadline_profiled_only=profiled_only))
        self.weights = self.config.initial_weights()
        self.adaptive = self.config.preset == "adaptive" and not self.config.weights
        self.tier_gain: dict[int, float] = {}
        self.last_accuracy: float | None = None
        self.last_shift = 0
        self.shifts: list[tuple[int, str]] = []
        self.samples: dict[int, int] = {}  # each client's latest reported training-sample count
        self.utility: dict[int, float] = {}  # each client's latest statistical utility (util)
        self.exploring: set[int] = set()  # the last selection's explore draws (deadline_skips_explored)

    def speed_cost(self, ids: Sequence[int]) -> dict[int, float]:
        """What `fast` minimises per profiled client: its EMA latency, or that per training sample (fast_unit);
        a client whose sample count was never reported counts as the median client."""
        latency = {c: v for c in ids if (v := self.tiers.expected_latency(c)) is not None}
        if self.config.fast_unit == "latency" or not self.samples:
            return latency
        typical = statistics.median(self.samples.values())
        return {c: v / self.samples.get(c, typical) for c, v in latency.items()}

    def terms(self, ids: Sequence[int], k: int = 1, available: int | None = None) -> dict[str, dict[int, float]]:
        latency = self.speed_cost(ids)
        ordered = sorted(latency.values())
        quantile = min(1.0, self.config.pool() * k / max(available or len(ids), 1))
        rank = max(1, math.ceil(quantile * len(ordered) - 1e-9))
        pool_latency = ordered[min(rank, len(ordered)) - 1] if ordered else 1.0
        if self.config.cutoff() == "utility-rate" and latency:
            pool_latency = utility_rate_cutoff(latency, self.expected_utility(latency), k) or pool_latency
        max_part = max(self.participation.values(), default=0) or 1
        max_cpu = max(self.cpu_s.values(), default=0.0) or 1.0
        tier_acc = self.tier_accuracies()
        gap = _normalise({t: -a for t, a in tier_acc.items()})  # worst accuracy -> 1
        gain = _normalise(self.tier_gain)
        client_term = self.client_accuracy_terms(ids)
        util_term = self.utility_terms(ids)
        share = self.config.afair_client_share
        out: dict[str, dict[int, float]] = {k: {} for k in KNOBS}
        for c in ids:
            tier = self.tiers.tier_of(c)
            out["fast"][c] = min(1.0, pool_latency / latency[c]) if c in latency and latency[c] > 0 else 0.5
            cpu_share = self.config.rfair_cpu_share
            out["rfair"][c] = 1 - ((1 - cpu_share) * self.participation.get(c, 0) / max_part
                                   + cpu_share * self.cpu_s.get(c, 0.0) / max_cpu)
            tier_term = gap.get(tier, 0.5) if tier is not None else 0.5
            out["afair"][c] = (1 - share) * tier_term + share * client_term.get(c, 0.5)
            out["perf"][c] = gain.get(tier, 0.5) if tier is not None else 0.5
            out["util"][c] = util_term.get(c, 0.5)
        for c, slowdown in self.slowdowns(ids, latency, pool_latency).items():
            for knob in self.config.slow_knobs:
                out[knob][c] *= slowdown
        return out

    def slowdowns(self, ids: Sequence[int], latency: dict[int, float], pool_latency: float) -> dict[int, float]:
        """slow_penalty: the factor on the other knobs' terms of each client slower than the reference."""
        alpha = self.config.penalty()
        if not alpha:
            return {}
        if self.config.slow_by == "latency":
            return {c: (pool_latency / v) ** alpha for c, v in latency.items() if v > pool_latency}
        rate = {c: self.samples[c] / v for c in ids if self.samples.get(c) and (v := self.tiers.expected_latency(c))}
        typical = statistics.median(rate.values()) if rate else 0.0
        return {c: (r / typical) ** alpha for c, r in rate.items() if r < typical}

    def expected_utility(self, ids: Iterable[int]) -> dict[int, float]:
        """Measured utility; with util_prior "size", a client not measured yet gets its registered count x the
        measured clients' median utility per sample (utility grows with data); else it is left out (median)."""
        known = {c: self.utility[c] for c in ids if c in self.utility}
        if self.config.util_prior == "median":
            return known
        per_sample = [u / self.samples[c] for c, u in self.utility.items() if self.samples.get(c)]
        if not per_sample:
            return known
        rate = statistics.median(per_sample)
        sizes = self.registered_samples
        return {c: known[c] if c in known else rate * sizes[c] for c in ids if c in known or c in sizes}

    def utility_terms(self, ids: Sequence[int]) -> dict[int, float]:
        """Per-client util term: statistical utility over its cap, so one absurd loss gains nothing over the top few."""
        known = sorted(self.utility[c] for c in ids if c in self.utility)
        cap = percentile(known, self.config.util_clip, presorted=True) if known else 0.0
        if cap <= 0:
            return {}
        return {c: min(self.utility[c], cap) / cap for c in ids if c in self.utility}

    def client_accuracy_terms(self, ids: Sequence[int]) -> dict[int, float]:
        """Per-client afair term: the worst latest accuracy -> 1, faded to 0.5 with the reading's age."""
        if not self.accuracy:
            return {}
        best, worst = max(self.accuracy.values()), min(self.accuracy.values())
        decay = self.config.afair_staleness_decay
        out = {}
        for c in ids:
            if c not in self.accuracy:
                continue
            raw = (best - self.accuracy[c]) / (best - worst) if best > worst else 0.5
            age = max(0, self.latest_round - self.accuracy_round.get(c, self.latest_round))
            out[c] = 0.5 + (raw - 0.5) * decay ** age
        return out

    def select(self, round_num: int, available: Sequence[int], k: int, rng: random.Random) -> list[int]:
        ids = self.offer(available)
        k = min(k, len(ids))
        # rounded up: with k = 5 and explore 0.1, round() gives no slot at all, and a scheduler that
        # never explores can stay on the clients it happened to measure first
        n_explore = min(k, math.ceil(self.config.explore * k - 1e-9))
        unprofiled = [c for c in ids if c not in self.tiers.ema]
        n_unprofiled = min(n_explore, len(unprofiled))
        explore = rng.sample(unprofiled, n_unprofiled) if self.config.explore_by == "random" else \
            explore_by_size(unprofiled, n_unprofiled, self.registered_samples, EXPLORE_WINDOW, rng)
        taken = set(explore)
        if len(explore) < n_explore:
            more = rng.sample([c for c in ids if c not in taken], n_explore - len(explore))
            explore += more
            taken.update(more)
        self.exploring = set(explore)
        # A client never selected nor measured scores the same constant; score only the others, so a
        # round costs O(clients touched) on top of one pass over the available ids.
        known = [c for c in ids if c not in taken and (c in self.participation or c in self.tiers.ema)]
        known_set = set(known)
        fresh = [c for c in ids if c not in taken and c not in known_set]
        fresh_score = sum(self.weights[knob] * FRESH_TERMS[knob] for knob in KNOBS)
        terms = self.terms(known, k, len(ids))
        score = {c: sum(self.weights[knob] * terms[knob][c] for knob in KNOBS) for c in known}
        need = k - len(explore)
        if self.config.temperature == 0:
            tie = {c: rng.random() for c in known}
            ranked = sorted(known, key=lambda c: (-score[c], tie[c]))
            split = sum(1 for c in ranked if score[c] >= fresh_score)  # ranked is sorted: a prefix
            fresh_pick = rng.sample(fresh, min(max(need - split, 0), len(fresh)))
            return sorted(explore + (ranked[:split] + fresh_pick + ranked[split:])[:need])
        # fresh clients are interchangeable: `need` of them stand for all
        pool = known + rng.sample(fresh, min(need, len(fresh)))
        top = max([score[c] for c in known] + [fresh_score])
        weights = [math.exp((score.get(c, fresh_score) - top) / self.config.temperature) for c in pool]
        return sorted(explore + weighted_sample(pool, weights, need, rng))

    def round_deadline(self, selected: Sequence[int]) -> float:
        exploited = [c for c in selected if c not in self.exploring]
        return super().round_deadline(exploited if self.config.deadline_skips_explored and exploited else selected)

    def observe(self, outcome: RoundOutcome) -> None:
        super().observe(outcome)
        for s in signals(outcome):
            if s.samples > 0:
                self.samples[s.client_id] = s.samples
            if not s.late and s.loss_sq_mean is not None:  # a late update taught nothing about its data
                self.utility[s.client_id] = s.samples * math.sqrt(s.loss_sq_mean)
        accuracy = outcome.global_metrics.get("accuracy")
        if accuracy is not None and self.last_accuracy is not None and outcome.selected:
            delta = float(accuracy) - self.last_accuracy
            shares: dict[int, int] = {}
            for cid in outcome.selected:
                tier = self.tiers.tier_of(cid)
                if tier is not None:
                    shares[tier] = shares.get(tier, 0) + 1
            for tier, count in shares.items():
                beta = self.config.gain_beta * count / len(outcome.selected)
                self.tier_gain[tier] = (1 - beta) * self.tier_gain.get(tier, 0.0) + beta * delta
        if accuracy is not None:
            self.last_accuracy = float(accuracy)
        if self.adaptive:
            self.adapt(outcome.round)

    def adapt(self, round_num: int) -> None:
        if round_num - self.last_shift < self.tracking.plateau_window:
            return
        if not self.plateau.plateaued():
            return
        accuracies = list(self.tier_accuracies().values())
        gap = max(accuracies) - min(accuracies) if accuracies else 0.0
        if self.participation_jain() < self.config.rfair_target and self.weights["rfair"] < 0.5:
            target = "rfair"
        else:
            target = "afair" if gap > self.config.afair_gap else "perf"
        spare = self.weights["fast"] - self.config.fast_floor
        moved = min(self.config.shift, spare) if spare > 1e-12 else 0.0
        if moved == 0:  # nothing left to take from fast: take from the largest other knob
            donor = max((k for k in KNOBS if k not in (target, "fast")), key=lambda k: self.weights[k])
            moved = min(self.config.shift, self.weights[donor]) / 2
            self.weights[donor] -= moved
        else:
            self.weights["fast"] -= moved
        self.weights[target] += moved
        self.last_shift = round_num
        self.shifts.append((round_num, target))

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {
            "weights": dict(self.weights), "tier_gain": {str(k): v for k, v in self.tier_gain.items()},
            "last_accuracy": self.last_accuracy, "last_shift": self.last_shift,
            "shifts": [list(s) for s in self.shifts], "samples": {str(k): v for k, v in self.samples.items()},
            "utility": {str(k): v for k, v in self.utility.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.weights = {k: float(state["weights"].get(k, 0.0)) for k in KNOBS}  # util absent: saved before it
        self.tier_gain = {int(k): float(v) for k, v in state["tier_gain"].items()}
        self.last_accuracy = state["last_accuracy"]
        self.last_shift = int(state["last_shift"])
        self.shifts = [(int(r), str(t)) for r, t in state["shifts"]]
        self.samples = {int(k): int(v) for k, v in state.get("samples", {}).items()}  # absent: saved before it
        self.utility = {int(k): float(v) for k, v in state.get("utility", {}).items()}


def _preset_class(preset_name: str) -> type[HeteroScheduler]:
    return type(f"{preset_name.capitalize()}Scheduler", (HeteroScheduler,),
                {"name": preset_name, "preset": preset_name, "__module__": __name__,
                 "__doc__": f"HeteroScheduler, preset {preset_name}."})


PRESET_SCHEDULERS = {name: _preset_class(name) for name in PRESETS}
