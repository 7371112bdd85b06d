"""The engine: estimate one plan, build the search space, search it, suggest, tune, calibrate.

Imports core, catalogs, cost and strategies; never torch at module level (probes are passed in).
"""
