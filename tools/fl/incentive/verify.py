"""Verified work: the server scores every update against its own validation split before accepting it.

Self-reported quality cannot be checked, so pay must not rest on it. Each round the server trains
one reference update on its validation split (FLTrust, Cao et al. NDSS'21): the current global
model, the job's TrainSpec, a seed derived from the job seed and the round. Every update is then
checked, before its receipt, against that reference:

  * size per optimiser step:  r_i = (|d_i| / steps(n_i)) / (|d_ref| / steps(n_val)),  d = w - w_global.
    r_i < NORM_RATIO_MIN: the weights are (nearly) unchanged, a free-rider;
    r_i > NORM_RATIO_MAX x scale: the update is scaled up (or is noise of a larger size); the scale
    is learnt from the previous round (reference()), 1 for the MLP on digits.
    Dividing by the optimiser steps the server knows a client takes (its partition size and the
    TrainSpec fix them) is what makes one bound fit clients of 7 and of 150 samples.
  * direction: alignment a_i = cos(d_i, d_ref). a_i < MIN_ALIGNMENT: the update moves the model
    away from what the server's labelled data asks for (sign-flipped, label-flipped). The bound is
    below 0 because once the model fits the validation split the reference is small and noisy, and
    honest updates under label skew then align at -0.09..0.25 (digits, Dirichlet 0.5, rounds 30-40).

An accepted update's verified quality is max(a_i, 0) (in [0, 1]); it replaces the claimed quality for
selection, the quality floor (aggregation) and pay, so a quality liar gains nothing by lying.

Cost: one local training on the validation split per round (digits: 180 samples, 49 steps of the
64-unit MLP, tens of ms) and one dot product per update; the server also holds the split (half of
the global held-out data), which is not used for the reported test accuracy.

The bounds were chosen on digits with the MLP (Dirichlet 0.5 and 1.0, rounds 1-15, seed 0): honest
updates had r in 0.79-2.59 and a in 0.03-0.62; a 10x scaled update r >= 8; free-riders r < 0.001.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlsyskit.tools.fl.config import TrainSpec
from mlsyskit.tools.fl.data import ClientData
from mlsyskit.tools.fl.model import Weights, flatten

NORM_RATIO_MIN = 0.1
NORM_RATIO_MAX = 5.0
MIN_ALIGNMENT = -0.1
TYPICAL_RATIO = 1.5  # median r of honest MLP updates on digits; other models and partitions drift from it


@dataclass(frozen=True)
class Reference:
    """The server's own update for one round."""

    base: np.ndarray  # the global model, flattened
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
        self.scale = 1.0  # learnt size scale of this job's updates (see reference())
        self._ratios: list[float] = []  # r of every well-formed update since the last reference

    def reference(self, weights: Weights, seed: int) -> Reference:
        """The round's reference update. It also rolls the size scale forward: from the second round on,
        the bounds stretch by max(1, median r of the previous round / TYPICAL_RATIO), so a model or a
        partition whose updates are larger per step than the MLP's (a CNN on two labels per client: r ~6)
        is not refused every round. The median needs a majority of honest updates to stay honest."""
        if self._ratios:
            self.scale = max(1.0, float(np.median(self._ratios)) / TYPICAL_RATIO)
            self._ratios = []
        trained = self._train(weights, self.validation, self.spec, self.num_features, self.num_classes, seed).weights
        base = flatten(weights)
        delta = flatten(trained) - base
        per_step = float(np.linalg.norm(delta)) / self._steps(self.validation.num_samples, self.spec)
        return Reference(base, delta, per_step)

    def state_dict(self) -> dict:
        return {"scale": self.scale, "ratios": list(self._ratios)}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self._ratios = float(state.get("scale", 1.0)), [float(r) for r in state.get("ratios", [])]

    def check(self, reference: Reference, weights: Weights, num_samples: int) -> Verdict:
        delta = flatten(weights) - reference.base
        norm = float(np.linalg.norm(delta))
        if reference.norm_per_step <= 0:  # the reference did not move (a converged or dead model): size says nothing
            ratio = 1.0
        else:
            ratio = norm / self._steps(num_samples, self.spec) / reference.norm_per_step
        self._ratios.append(ratio)
        if ratio < NORM_RATIO_MIN:
            return Verdict(f"weights (nearly) unchanged: update size {ratio:.3g}x the server's reference "
                           f"(minimum {NORM_RATIO_MIN})", 0.0, ratio, 0.0)
        if ratio > NORM_RATIO_MAX * self.scale:
            return Verdict(f"update {ratio:.3g}x the size of the server's reference "
                           f"(maximum {NORM_RATIO_MAX * self.scale:.3g})", 0.0, ratio, 0.0)
        ref_norm = float(np.linalg.norm(reference.delta))
        alignment = float(delta @ reference.delta) / (norm * ref_norm) if norm > 0 and ref_norm > 0 else 0.0
        if alignment < MIN_ALIGNMENT:
            return Verdict(f"update points away from the server's validation data (alignment {alignment:.3f})",
                           0.0, ratio, alignment)
        # between MIN_ALIGNMENT and 0: accepted (late in training honest updates stray a little below 0) but worth
        # nothing, so it is neither aggregated nor paid (the floor needs a positive quality)
        return Verdict(None, min(max(alignment, 0.0), 1.0), ratio, alignment)
