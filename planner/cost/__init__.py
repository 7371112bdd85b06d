"""Cost formulas: pure arithmetic over specs. No torch, no optuna (see DESIGN.md layers)."""
