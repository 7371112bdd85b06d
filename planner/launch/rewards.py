"""GRPO's reward functions for the planner launch: the user's, named ``module:function``
(``--reward``), or for a smoke test on the sample data, ``completion_length``."""

import importlib
import sys
from pathlib import Path

from planner.core.errors import PlannerInputError


def completion_length(completions, **_) -> list[float]:
    """A smoke-test reward: each completion's length in characters over 100 (no task, only a
    signal that varies: never a training objective)."""
    return [len(c if isinstance(c, str) else str(c)) / 100 for c in completions]


def load(spec: str):
    """The callable ``module:function`` names, imported with the working directory on the path."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise PlannerInputError(f"--reward {spec}: not module:function", hint="e.g. --reward my_rewards:accuracy")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise PlannerInputError(f"--reward {spec}: cannot import it: {e}") from None
    if not callable(fn):
        raise PlannerInputError(f"--reward {spec}: {name} is not a function")
    return fn
