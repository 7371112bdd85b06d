"""The command line of a script that generates a docs page (benchmarks/measured_report.py,
benchmarks/world_corpus.py): print the page, or with --write put it in its file, which a test
then holds to what the script makes."""

import argparse
from collections.abc import Callable
from pathlib import Path


def page_command(doc: str, make: Callable[[], str], path: Path, root: Path) -> int:
    """Parse ``--write``; print ``make()``, or write it to ``path`` (named relative to ``root``)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write {path.relative_to(root)}")
    args = ap.parse_args()
    text = make()
    if args.write:
        path.write_text(text)
        print(f"wrote {path.relative_to(root)}")
    else:
        print(text, end="")
    return 0
