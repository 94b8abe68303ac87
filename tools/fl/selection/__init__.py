"""Client selectors behind one interface (base.Selector: select, observe, state_dict).

Strategies compose the selector they need; the heterogeneity-aware schedulers that plug in here
by name are in mlsyskit.tools.fl.scheduling (SCHEDULERS).
"""
