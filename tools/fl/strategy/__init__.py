"""Strategies by name (`--strategy fedavg|tiff`), registered here from an explicit tuple.

The suite's one plug-in convention: a class per file with a `name`, added to the tuple below;
plug-in modules never import the registry, so there is no import cycle. A strategy composes its
selector and incentive (selection/, incentive/) directly.
"""
from mlsyskit.core.registry import Registry
from mlsyskit.tools.fl.strategy.base import Strategy
from mlsyskit.tools.fl.strategy.fedavg import FedAvg
from mlsyskit.tools.fl.strategy.tiff import Tiff

STRATEGIES: Registry[Strategy] = Registry("strategy")
for _cls in (FedAvg, Tiff):
    STRATEGIES.add(_cls)

__all__ = ["STRATEGIES", "Strategy"]
