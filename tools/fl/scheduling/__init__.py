"""Heterogeneity-aware FL scheduling (issue 12): resources, availability, tiers, schedulers, metrics.

Schedulers implement the project's Selector interface (tools/fl/selection/base.py) and are found
by name in SCHEDULERS: random, tifl, oort, and ours: fast, rfair, afair, perf, adaptive.
"""
from mlsyskit.core.registry import Registry
from mlsyskit.tools.fl.scheduling.hetero import PRESET_SCHEDULERS
from mlsyskit.tools.fl.scheduling.oort import OortScheduler
from mlsyskit.tools.fl.scheduling.tifl import TiflScheduler
from mlsyskit.tools.fl.selection.base import Selector
from mlsyskit.tools.fl.selection.random_pick import RandomSelector

SCHEDULERS: Registry[Selector] = Registry("scheduler")
SCHEDULERS.add(RandomSelector, "random")
SCHEDULERS.add(TiflScheduler)
SCHEDULERS.add(OortScheduler)
for _cls in PRESET_SCHEDULERS.values():
    SCHEDULERS.add(_cls)


def make_scheduler(name: str, config=None, tracking=None) -> Selector:
    """A scheduler by name; `config` is its own config dataclass (None: its defaults)."""
    cls = SCHEDULERS.get(name)
    if cls is RandomSelector:
        return RandomSelector(config)
    return cls(config, tracking)
