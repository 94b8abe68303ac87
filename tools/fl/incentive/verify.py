"""Verified work: the server scores every update against its own validation split before accepting it.

Self-reported quality cannot be checked, so pay must not rest on it. Each round the server trains
one reference update on its validation split (FLTrust, Cao et al. NDSS'21): the current global
model, the job's TrainSpec, a seed derived from the job seed and the round. Every update is then
checked, before its receipt, against that reference:

  * size per optimiser step:  r_i = (|d_i| / steps(n_i)) / (|d_ref| / steps(n_val)),  d = w - w_global.
    r_i < NORM_RATIO_MIN: the weights are (nearly) unchanged, a free-rider, refused.
    Dividing by the optimiser steps the server knows a client takes (its partition size and the
    TrainSpec fix them) is what makes one bound fit clients of 7 and of 150 samples.
  * direction: alignment a_i = cos(d_i, d_ref). a_i < MIN_ALIGNMENT: the update moves the model
    away from what the server's labelled data asks for (sign-flipped, label-flipped). The bound is
    below 0 because once the model fits the validation split the reference is small and noisy, and
    honest updates under label skew then align at -0.09..0.25 (digits, Dirichlet 0.5, rounds 30-40).

No update is refused for being large. Size is bounded instead, when the round closes (bound()):
every valid update is scaled down to at most CLIP_RATIO x the typical size per step, its verified
quality is multiplied by the same factor, and so is its weight in the aggregate (strategy/base.py),
so a scaled update enters the aggregate no larger than an honest one, counts as little as it was
shrunk, and earns as little as its bounded worth. The typical size is a low quantile
(TYPICAL_QUANTILE) of the r of this round's and the previous WINDOW - 1 rounds' valid updates: it
stays an honest value while fewer than 3 in 4 of those updates are inflated, also in a round that
attackers happen to fill (with half the clients attackers, 4 or 5 of 5 in 15% of rounds; a
this-round-only quantile let those rounds through at full size, measured on digits, Dirichlet
0.05). It is capped at TYPICAL_CAP x the reference, so a first round of attackers only is still
bounded by the server's own update (FLTrust's anchor).
Earlier rounds refused r > 5 x a scale learnt from the previous round's median r: at 10k synthetic
clients half of the honest updates of round 1 were refused, and with half the clients scaling their
updates the median followed the attackers (issue 21).

An accepted update's verified quality is max(a_i, 0) (in [0, 1]); it replaces the claimed quality for
selection, the quality floor (aggregation) and pay, so a quality liar gains nothing by lying.

Cost: one local training on the validation split per round (digits: 180 samples, 49 steps of the
64-unit MLP, tens of ms) and one dot product per update; the server also holds the split (half of
the global held-out data), which is not used for the reported test accuracy.

The bounds were chosen on digits with the MLP (Dirichlet 0.5 and 1.0, rounds 1-15, seed 0): honest
updates had r in 0.79-2.59 and a in 0.03-0.62; a 10x scaled update r >= 8; free-riders r < 0.001.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from mlsyskit.tools.fl.config import TrainSpec
from mlsyskit.tools.fl.data import ClientData
from mlsyskit.tools.fl.model import Weights, flatten

NORM_RATIO_MIN = 0.1
MIN_ALIGNMENT = -0.1
CLIP_RATIO = 2.0  # x the round's typical size per step: the most any update may weigh in the aggregate
TYPICAL_QUANTILE = 0.25  # of the round's size ratios r
TYPICAL_CAP = 20.0  # x the reference: the typical size never exceeds this, whoever sent the round's updates
WINDOW = 5  # rounds of size ratios (this one and the previous 4) the typical size is taken from


@dataclass(frozen=True)
class Reference:
    """The server's own update for one round."""

    base: np.ndarray  # the global model, flattened
    weights: Weights  # the global model
    delta: np.ndarray  # reference update, flattened
    norm_per_step: float


@dataclass(frozen=True)
class Verdict:
    reason: str | None  # None: accepted
    quality: float  # verified quality in [0, 1]; 0 when rejected
    norm_ratio: float
    alignment: float


class UpdateVerifier:
    def __init__(self, validation: ClientData, spec: TrainSpec, num_features: int, num_classes: int,
                 trainer=None) -> None:
        if len(validation.y_train) == 0:
            raise ValueError("the server's validation split is empty: updates cannot be verified")
        from mlsyskit.tools.fl.training import optimizer_steps, train_local

        self.validation, self.spec = validation, spec
        self.num_features, self.num_classes = num_features, num_classes
        self._train = trainer or train_local
        self._steps = optimizer_steps
        self._recent: list[list[float]] = []  # the valid updates' r of the previous WINDOW - 1 rounds

    def reference(self, weights: Weights, seed: int) -> Reference:
        """The round's reference update: the global model trained on the validation split."""
        trained = self._train(weights, self.validation, self.spec, self.num_features, self.num_classes, seed).weights
        base = flatten(weights)
        delta = flatten(trained) - base
        per_step = float(np.linalg.norm(delta)) / self._steps(self.validation.num_samples, self.spec)
        return Reference(base, weights, delta, per_step)

    def state_dict(self) -> dict:
        return {"recent_ratios": [list(r) for r in self._recent]}

    def load_state_dict(self, state: dict) -> None:
        """The recent rounds' size ratios (an older checkpoint's learnt size scale is no longer used)."""
        self._recent = [[float(x) for x in r] for r in state.get("recent_ratios", [])]

    def size(self, reference: Reference, weights: Weights, num_samples: int) -> tuple[np.ndarray, float, float]:
        """(d, |d|, r) of one update against the round's reference."""
        delta = flatten(weights) - reference.base
        norm = float(np.linalg.norm(delta))
        if reference.norm_per_step <= 0:  # the reference did not move (a converged or dead model): size says nothing
            return delta, norm, 1.0
        return delta, norm, norm / self._steps(num_samples, self.spec) / reference.norm_per_step

    def bound(self, reference: Reference, updates: Mapping[int, tuple[Weights, int]]
              ) -> tuple[dict[int, Weights], dict[int, float]]:
        """Every update scaled down to the round's size bound: (bounded updates, factor per update in (0, 1])."""
        ratios = {cid: self.size(reference, w, n)[2] for cid, (w, n) in updates.items()}
        factors = size_factors(ratios, [r for past in self._recent for r in past])
        self._recent = (self._recent + [list(ratios.values())])[-(WINDOW - 1):]
        bounded = {}
        for cid, (weights, _) in updates.items():
            f = factors[cid]
            bounded[cid] = weights if f >= 1.0 else \
                {k: (base + f * (v.astype(np.float64) - base)).astype(v.dtype)
                 for k, v, base in ((k, v, reference.weights[k].astype(np.float64)) for k, v in weights.items())}
        return bounded, factors

    def check(self, reference: Reference, weights: Weights, num_samples: int) -> Verdict:
        delta, norm, ratio = self.size(reference, weights, num_samples)
        if ratio < NORM_RATIO_MIN:
            return Verdict(f"weights (nearly) unchanged: update size {ratio:.3g}x the server's reference "
                           f"(minimum {NORM_RATIO_MIN})", 0.0, ratio, 0.0)
        ref_norm = float(np.linalg.norm(reference.delta))
        alignment = float(delta @ reference.delta) / (norm * ref_norm) if norm > 0 and ref_norm > 0 else 0.0
        if alignment < MIN_ALIGNMENT:
            return Verdict(f"update points away from the server's validation data (alignment {alignment:.3f})",
                           0.0, ratio, alignment)
        # between MIN_ALIGNMENT and 0: accepted (late in training honest updates stray a little below 0) but worth
        # nothing, so it is neither aggregated nor paid (the floor needs a positive quality)
        return Verdict(None, min(max(alignment, 0.0), 1.0), ratio, alignment)


def size_factors(ratios: Mapping[int, float], earlier: Sequence[float] = ()) -> dict[int, float]:
    """Per update (size ratio r), the factor that scales it down to the round's bound: 1 within it, else
    bound / r, with bound = CLIP_RATIO x min(TYPICAL_CAP, the TYPICAL_QUANTILE quantile of the r of this
    round and `earlier` (the previous rounds' r))."""
    if not ratios:
        return {}
    typical = min(TYPICAL_CAP, float(np.quantile([*ratios.values(), *earlier], TYPICAL_QUANTILE)))
    limit = CLIP_RATIO * typical
    return {cid: 1.0 if r <= limit or r <= 0 else limit / r for cid, r in ratios.items()}
