"""Strategies by name (`--strategy fedavg|tiff`)."""
from mlsyskit.core.registry import Registry

STRATEGIES: Registry = Registry("strategy")

from mlsyskit.tools.fl.strategy import fedavg, tiff  # noqa: E402,F401 (register)
