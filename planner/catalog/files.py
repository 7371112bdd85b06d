"""Reading a user's or a catalog's JSON / YAML / TOML mapping, with every failure a clear input error."""

import json
import stat
import tomllib
from pathlib import Path

import yaml

from planner.core.errors import PlannerInputError

#: libyaml's safe loader (shipped in PyYAML wheels) is ~10x faster than the pure-Python one;
#: the catalog's 21 GPU files took 250 ms with the latter.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


#: Limits a job or catalog file must keep before a parser sees it: real ones are a few KiB and a
#: few levels deep. Deeper nesting makes json recurse past Python's limit and libyaml's C loader
#: crash the process (a segfault near 100,000 levels), so the text is measured first.
MAX_FILE_BYTES = 16 * 2**20
MAX_NESTING = 100
MAX_INDENT = 400  # columns of block nesting (indentation and "- " / "? " entries)


def regular_file(path: Path, what: str, hint: str = "") -> int:
    """The size of ``path`` if it is a regular file (not a directory, FIFO or device, which would
    fail or block when read), else a PlannerInputError."""
    try:
        st = path.stat()
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the name
        raise PlannerInputError(f"cannot read {what} {str(path)[:200]}: {e}"[:400], hint=hint) from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (a FIFO, socket or device)"
        raise PlannerInputError(f"cannot read {what} {path}: it is {kind}", hint=hint or "Give the path of a file.")
    return st.st_size


def nesting_depth(text: str) -> int:
    """The deepest bracket nesting of a JSON / YAML flow text, brackets inside strings counted
    too: an upper bound, which is what guards a parser (skipping quoted text would let a stray
    apostrophe of a YAML plain scalar hide the brackets after it)."""
    depth = deepest = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth = max(0, depth - 1)
    return deepest


def block_depth(text: str) -> int:
    """The deepest YAML block nesting a line can open: its indentation plus the sequence entries
    and explicit keys that open on it (``- - - x``, ``? ? x``: each a level for libyaml)."""
    deepest = 0
    for line in text.splitlines():
        rest = line.lstrip(" \t")
        level = len(line) - len(rest)
        while rest[:2] in ("- ", "? ", ": ") or rest in ("-", "?"):
            rest = rest[2:].lstrip(" \t")
            level += 2
        deepest = max(deepest, level)
    return deepest


def read_document(path: Path, what: str, hint: str = "", kind: str | None = None):
    """The value a .json / .toml (else YAML) file holds; ``what`` names it in messages; ``kind``:
    "JSON", "TOML" or "YAML" whatever the suffix. Only regular files of at most MAX_FILE_BYTES, nested at most
    MAX_NESTING deep, reach a parser."""
    if regular_file(path, what, hint) > MAX_FILE_BYTES:
        raise PlannerInputError(f"{what} {path} is over {MAX_FILE_BYTES // 2**20} MiB, more than such a file holds", hint=hint)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError, ValueError) as e:  # ValueError: a NUL byte in the name
        raise PlannerInputError(f"cannot read {what} {path}: {e}", hint=hint) from None
    if nesting_depth(text) > MAX_NESTING or block_depth(text) > MAX_INDENT:
        raise PlannerInputError(f"{what} {path} is nested deeper than such a file is ({MAX_NESTING} brackets or "
                                f"{MAX_INDENT} columns of YAML blocks at most)", hint=hint)
    kind = kind or {".json": "JSON", ".toml": "TOML"}.get(path.suffix.lower(), "YAML")
    try:
        if kind == "TOML":
            return tomllib.loads(text)
        return json.loads(text) if kind == "JSON" else yaml.load(text, Loader=_YAML_LOADER)
    except (json.JSONDecodeError, yaml.YAMLError, tomllib.TOMLDecodeError) as e:
        raise PlannerInputError(f"{what} {path} is not valid {kind}: {e}"[:1000], hint=hint) from None
    except (ValueError, RecursionError, OverflowError) as e:  # an integer over Python's 4,300 digits, ...
        why = "it holds a number over 4,300 digits long" if "digits" in str(e) else str(e)[:200]
        raise PlannerInputError(f"{what} {path} cannot be read as {kind}: {why}", hint=hint) from None


def read_mapping(path: Path, what: str, hint: str = "") -> dict:
    """The top-level mapping of a .json / .toml / .yaml / .yml file (``read_document``)."""
    data = read_document(path, what, hint)
    if not isinstance(data, dict):
        raise PlannerInputError(f"{what} {path} must hold a mapping of keys to values", hint=hint)
    return data
