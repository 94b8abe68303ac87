"""Every client selector by name, behind one interface (selection/base.Selector).

TIFF's selectors (random, quality-greedy, trusted-random) and the heterogeneity-aware schedulers
(tifl, oort, and ours: fast, rfair, afair, perf, adaptive) are one family: built the same way,
`cls(config, tracking)` (None: defaults), and registered once here. `--scheduler NAME` names any
of them; `scheduled_selector` composes it with the strategy's own selector.
"""
from __future__ import annotations

from mlsyskit.core.registry import Registry
from mlsyskit.tools.fl.scheduling.gated import GatedScheduler
from mlsyskit.tools.fl.scheduling.hetero import PRESET_SCHEDULERS
from mlsyskit.tools.fl.scheduling.oort import OortScheduler
from mlsyskit.tools.fl.scheduling.tifl import TiflScheduler
from mlsyskit.tools.fl.selection.base import Selector
from mlsyskit.tools.fl.selection.quality_greedy import QualityGreedySelector
from mlsyskit.tools.fl.selection.random_pick import RandomSelector
from mlsyskit.tools.fl.selection.trusted_random import TrustedRandomSelector

SELECTORS: Registry[Selector] = Registry("selector")
for _cls in (RandomSelector, QualityGreedySelector, TrustedRandomSelector, TiflScheduler, OortScheduler,
             *PRESET_SCHEDULERS.values()):
    SELECTORS.add(_cls)


def make_selector(name: str, config=None, tracking=None) -> Selector:
    """A selector by name; `config` is its own config dataclass and `tracking` a TrackingConfig (None: defaults)."""
    return SELECTORS.get(name)(config, tracking)


def scheduled_selector(name: str, own: Selector, scheduler: Selector | None = None) -> Selector:
    """`--scheduler NAME`: the scheduler replaces plain random selection; any other selector (TIFF's trust)
    stays as the gate that narrows the pool the scheduler picks from."""
    scheduler = scheduler or make_selector(name)
    return scheduler if isinstance(own, RandomSelector) else GatedScheduler(own, scheduler)
