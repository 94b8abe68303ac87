"""Heterogeneity-aware FL scheduling (issue 12): resources, availability, tiers, schedulers, metrics.

The schedulers here (tifl, oort, and ours: fast, rfair, afair, perf, adaptive) implement the one
Selector interface (selection/base.py) and are registered with TIFF's selectors in one registry,
mlsyskit.tools.fl.selectors.SELECTORS.
"""
