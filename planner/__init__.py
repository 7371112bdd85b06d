"""planner: the fastest LLM training configuration that fits your GPUs.

Layers (see DESIGN.md): core types (units, errors, vocabulary, specs, ledger) ->
catalogs -> cost formulas -> strategies -> estimate / report -> cli. Nothing here imports torch.
"""

__version__ = "0.1.0"
