"""Client selectors behind one interface (base.Selector: select, observe, state_dict).

Strategies compose the selector they need; every selector, these and the heterogeneity-aware
schedulers (scheduling/), is found by name in one registry: mlsyskit.tools.fl.selectors.SELECTORS.
"""
