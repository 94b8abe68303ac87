"""Strategies by name (`--strategy fedavg|tiff|median|...|tiff+median|...`), registered here from an explicit tuple.

The suite's one plug-in convention: a class per file with a `name`, added to the tuple below;
plug-in modules never import the registry, so there is no import cycle. A strategy composes its
selector, incentive (selection/, incentive/) and aggregation rule (`rule`) directly.

The robust baselines are FedAvg (random selection, equal pay) with another rule: coordinate-wise
median, trimmed mean, multi-Krum, and the server optimisers FedAvgM and FedAdam. TIFF composes with
each of them as `tiff+<name>` (strategy/tiff.py: with_rule). `STRATEGIES.names()` is the one list of
choices: CLIs take theirs from it.
"""
from mlsyskit.core.registry import Registry
from mlsyskit.tools.fl.strategy.base import Strategy
from mlsyskit.tools.fl.strategy.fedadam import (
    CappedScaleFreeAdamRule,
    DriftRateAdamRule,
    FedAdam,
    ScaleFreeAdamRule,
    ValidatedRateAdamRule,
)
from mlsyskit.tools.fl.strategy.fedavg import FedAvg
from mlsyskit.tools.fl.strategy.fedavgm import FedAvgM
from mlsyskit.tools.fl.strategy.krum import Krum
from mlsyskit.tools.fl.strategy.median import Median
from mlsyskit.tools.fl.strategy.tiff import Tiff, with_rule
from mlsyskit.tools.fl.strategy.trimmed_mean import TrimmedMean

ROBUST = (Median, TrimmedMean, Krum, FedAvgM, FedAdam)  # FedAvg with another aggregation rule

STRATEGIES: Registry[Strategy] = Registry("strategy")
# not robust alone: offered only composed with TIFF
TIFF_ONLY_RULES = (ScaleFreeAdamRule, CappedScaleFreeAdamRule, DriftRateAdamRule, ValidatedRateAdamRule)
for _cls in (FedAvg, Tiff, *ROBUST, *(with_rule(r) for r in (*(s.rule for s in ROBUST), *TIFF_ONLY_RULES))):
    STRATEGIES.add(_cls)

# The strategy a user gets when they name none (JobConfig.strategy, `fl-server run|simulate`): TIFF with scale-free
# FedAdam capped by the server's reference update, the best TIFF variant on the tuning data (digits). On held-out
# data no variant meets every issue-21 target: this one misses 2 of 8 cells (-11.7, -2.3 points), tiff+fedadam-sf
# the same 2 (-11.0, -3.0), tiff+fedadam 2 (-1.4, -11.6), plain tiff 4 (README, issue 21; docs/tiff.md).
# tiff+fedadam-sfv (the better of two rates on the validation split) misses 1 (-4.4) but scored 0.882 against
# 0.886 on digits, so it is not the default; tiff+fedadam-sfm scored 0.855 there.
DEFAULT_STRATEGY = "tiff+fedadam-sfcap"

__all__ = ["DEFAULT_STRATEGY", "ROBUST", "STRATEGIES", "Strategy"]
