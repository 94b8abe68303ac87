"""Client selectors by name."""
from mlsyskit.core.registry import Registry

SELECTORS: Registry = Registry("selector")

from mlsyskit.tools.fl.selection import quality_greedy, random_pick, trusted_random  # noqa: E402,F401 (register)
