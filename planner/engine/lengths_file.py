"""The token counts of a user's samples, read from a file (``--lengths``).

One sample per line, as any of:
- a whole number: the sample's tokens (``wc``-style lists, ``datasets``' ``.map(len)`` written out);
- two whole numbers: tokens and how many samples have that many (a histogram);
- a JSON object with the tokens already counted: ``input_ids`` (a list: its length), or a whole
  number under ``length``, ``num_tokens``, ``n_tokens`` or ``token_count`` (TRL and LLaMA-Factory
  tokenized datasets, exported with ``to_json``).
Blank lines and lines starting with ``#`` are skipped. planner does not tokenize text: counting
tokens needs the model's tokenizer, which the user's own pipeline has.
"""

import json
from collections import Counter
from functools import cache
from pathlib import Path

from planner.catalog.files import regular_file
from planner.core.errors import PlannerInputError
from planner.core.lengths import Lengths
from planner.core.vocabulary import MAX_SEQ_LEN

#: Keys of a JSON line that hold a sample's token count.
COUNT_KEYS = ("length", "num_tokens", "n_tokens", "token_count")
MAX_LENGTHS_BYTES = 2**30  # a histogram or one count per sample: 100 M samples fit
HINT = ("Give one sample per line: its token count, 'tokens count' pairs, or JSON lines with "
        "input_ids or a 'length' field (planner does not tokenize text).")


def read_lengths(path: Path) -> Lengths:
    """The samples' token counts in ``path``, or a PlannerInputError naming the first bad line."""
    size = regular_file(path, "--lengths", HINT)
    return _read(str(path.resolve()), size, path.stat().st_mtime_ns)


@cache
def _read(name: str, size: int, mtime_ns: int) -> Lengths:
    """(``size`` and ``mtime_ns`` key the cache: a file changed is read again.)"""
    if size > MAX_LENGTHS_BYTES:
        raise PlannerInputError(f"--lengths {name}: {size:,} bytes, more than planner reads "
                                f"({MAX_LENGTHS_BYTES:,})", hint="Give a histogram: 'tokens count' per line.")
    counts: Counter[int] = Counter()
    try:
        with open(name, encoding="utf-8", errors="strict") as f:
            for number, line in enumerate(f, 1):
                text = line.strip()
                if text and not text.startswith("#"):
                    tokens, samples = _parse(text, f"--lengths {name}:{number}")
                    counts[tokens] += samples
    except UnicodeDecodeError:
        raise PlannerInputError(f"--lengths {name}: not UTF-8 text", hint=HINT) from None
    except OSError as e:
        raise PlannerInputError(f"--lengths {name}: cannot read it ({e.strerror})", hint=HINT) from None
    if not counts:
        raise PlannerInputError(f"--lengths {name}: no sample lengths in it", hint=HINT)
    return Lengths(tuple(sorted(counts.items())), Path(name).name)


def _parse(text: str, where: str) -> tuple[int, int]:
    """(tokens, samples) of one line."""
    if text.startswith("{"):
        try:
            row = json.loads(text)
        except (ValueError, RecursionError):
            raise PlannerInputError(f"{where}: not a JSON object", hint=HINT) from None
        if not isinstance(row, dict):
            raise PlannerInputError(f"{where}: not a JSON object", hint=HINT)
        if isinstance(row.get("input_ids"), list):
            return _count(len(row["input_ids"]), where), 1
        found = next((k for k in COUNT_KEYS if k in row), None)
        if found is None:
            raise PlannerInputError(f"{where}: no token count (input_ids, or one of {', '.join(COUNT_KEYS)})",
                                    hint=HINT)
        return _count(row[found], where), 1
    parts = text.split()
    if len(parts) > 2 or not all(p.isascii() and p.isdigit() for p in parts):
        raise PlannerInputError(f"{where}: {text[:60]!r} is not a token count", hint=HINT)
    return _count(int(parts[0]), where), (_count(int(parts[1]), where, "samples") if len(parts) == 2 else 1)


def _count(value, where: str, what: str = "tokens") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SEQ_LEN:
        raise PlannerInputError(f"{where}: {what} must be a whole number from 1 to {MAX_SEQ_LEN:,}, not {value!r}"[:300],
                                hint=HINT)
    return value


def lengths_of(request) -> Lengths | None:
    """A request's samples' token counts (``DataShape.lengths``), or None."""
    return read_lengths(request.lengths) if getattr(request, "lengths", None) is not None else None
