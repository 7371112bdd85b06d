"""The distribution planner installs as, and the pip lines that install it.

The command is ``planner`` and the one top-level import package is ``planner``; the distribution
(the name pip installs) is ``llm-train-planner``, because ``planner`` on the public index is an
unrelated project (a best-first search library, 0.5.1). Every install line planner prints is built
here, so each one names this distribution (tests/test_install.py installs the wheel and checks it).
"""

from collections.abc import Iterable

#: The name pip installs (pyproject.toml's ``[project] name``; tests check they agree).
DIST = "llm-train-planner"


def install_line(extras: Iterable[str] = (), upgrade: bool = False) -> str:
    """``pip install 'llm-train-planner[a,b]'``: this project with the extras named, "train" first
    (the rest sorted). From a wheel folder rather than an index, add ``--find-links DIR``."""
    names = sorted(set(extras), key=lambda e: (e != "train", e))
    requirement = f"{DIST}[{','.join(names)}]" if names else DIST
    return f"pip install {'-U ' if upgrade else ''}'{requirement}'"
