"""Formatting for people, in one place. Internal values stay in base units."""

from planner.core.units import GIB


def gib(n_bytes: float, digits: int = 2) -> str:
    return f"{n_bytes / GIB:,.{digits}f} GiB"


def share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def count(n: int) -> str:
    """Parameter counts: 8.03B, 494.0M."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)
