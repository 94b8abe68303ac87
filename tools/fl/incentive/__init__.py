"""Incentive schemes by name, and the double-entry ledger they write to."""
from mlsyskit.core.registry import Registry

INCENTIVES: Registry = Registry("incentive")

from mlsyskit.tools.fl.incentive import equal_pay, tiff_tokens  # noqa: E402,F401 (register)
