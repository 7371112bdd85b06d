"""The keys a Trainer/TRL recipe file may hold, across the library versions people pin.

A recipe (``trl sft --config``, alignment-handbook, open-r1) is parsed by TRL's ``TrlParser`` into
a TRL trainer config (a ``TrainingArguments`` subclass), ``ModelConfig`` and the script's arguments;
a Trainer script parses ``TrainingArguments`` alone (``HfArgumentParser``). Both refuse a key
none of their dataclasses has. data/recipe_keys.json (tests/tools/recipe_keys.py) holds every
field of ``TrainingArguments`` in transformers 4.36 to 5.23, of TRL's configs, ``ModelConfig`` and
``ScriptArguments`` in TRL 0.8 to 1.16, and of the alignment-handbook's and open-r1's script
arguments, each with the versions that have it. So a recipe key is:
- a key of the installed transformers' ``TrainingArguments`` (data/known_keys.json): read;
- a key of TRL or a recipe framework: accepted (``TrlParser`` takes it);
- a key only older (or newer) transformers versions have: accepted with a warning naming those
  versions and the current name if there is one (``evaluation_strategy`` -> ``eval_strategy``);
- a key no version of any of them has: refused, as the loaders refuse it, with "did you mean".
"""

import difflib
import json
from functools import cache

from planner.catalog import DATA_DIR

#: How a message names each library of the key sets.
NAMES = {"transformers": "transformers", "trl": "TRL", "alignment-handbook": "alignment-handbook",
         "open-r1": "open-r1"}
#: The libraries whose newest version's keys a recipe may hold without a word.
RECIPE_LIBRARIES = ("trl", "alignment-handbook", "open-r1")
#: Key sets of other file formats (planner/check/frameworks.py), not a Trainer/TRL recipe's.
OTHER_FORMATS = ("llamafactory", "axolotl")


@cache
def recipe_keys() -> dict[str, tuple[tuple[str, ...], dict[str, tuple[int, ...]]]]:
    """library -> (versions oldest first, key -> indices of the versions that have it)."""
    data = json.loads((DATA_DIR / "recipe_keys.json").read_text())
    return {lib: (tuple(v["versions"]), {k: tuple(ix) for k, ix in v["keys"].items()})
            for lib, v in data.items() if lib != "source"}


def _span(versions: tuple[str, ...], indices: tuple[int, ...]) -> str:
    first, last = versions[indices[0]], versions[indices[-1]]
    return first if first == last else f"{first} to {last}"


def suggestion(key: str, candidates) -> str:
    """' (did you mean X?)' for the closest candidate, or ''."""
    close = difflib.get_close_matches(key, sorted(candidates), n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def read_recipe_keys(d: dict, installed: frozenset[str], where: str, extra: tuple = ()) -> tuple[list[str], list[str]]:
    """(problems, warnings) for the keys of a Trainer/TRL recipe mapping ``d``: see the module
    docstring. ``installed``: the installed transformers' TrainingArguments fields."""
    sets = recipe_keys()
    older: list[str] = []
    unknown: list[str] = []
    for key in sorted(str(k) for k in d):
        if key in installed or key in extra:
            continue
        if any(key in sets[lib][1] for lib in RECIPE_LIBRARIES if lib in sets):
            continue
        if "transformers" in sets and key in sets["transformers"][1]:
            versions, keys = sets["transformers"]
            older.append(f"{key} (transformers {_span(versions, keys[key])}){suggestion(key, installed)}")
            continue
        unknown.append(key)
    warnings = []
    if older:
        newest = sets["transformers"][0][-1]
        warnings.append(f"{where}: keys of other transformers versions only: {', '.join(older)}; transformers "
                        f"{newest} refuses them, so run this file with a version that has them")
    problems = []
    if unknown:
        libraries = {lib: v for lib, v in sets.items() if lib not in OTHER_FORMATS}
        every = set(installed).union(*(keys for _, keys in libraries.values()))
        named = ", ".join(k + suggestion(k, every) for k in unknown)
        spans = "; ".join(f"{NAMES.get(lib, lib)} {v[0]} to {v[-1]}" if len(v) > 1 else f"{NAMES.get(lib, lib)} @{v[0]}"
                          for lib, (v, _) in libraries.items())
        problems.append(f"{where}: unknown key(s) {named}: no TrainingArguments, TRL config, ModelConfig or script "
                        f"arguments has them ({spans}), and their parsers refuse unknown keys")
    return problems, warnings
