"""Regenerate planner/catalog/data/recipe_keys.json: the keys a Trainer/TRL recipe file may hold, per
library version, read from the released sources without importing them.

    pip download --no-deps transformers==4.46.3 trl==0.12.2 ... -d wheels/
    python tests/tools/recipe_keys.py planner/catalog/data/recipe_keys.json wheels/*.whl \\
        alignment-handbook@c8f5bdf6=old-configs.py alignment-handbook@925acdfe=configs.py \\
        open-r1@1416fa0c=configs.py

A recipe (``trl sft --config recipe.yaml``, alignment-handbook, open-r1) is parsed by TRL's
``TrlParser`` into several dataclasses at once: a TRL trainer config (``SFTConfig``, ``DPOConfig``,
... subclasses of transformers' ``TrainingArguments``), ``ModelConfig`` and the script's
arguments. The keys are the fields of those dataclasses:
- transformers wheels: ``TrainingArguments`` (transformers/training_args.py);
- TRL wheels: every dataclass named ``*Config`` or ``*Arguments`` in its trainer configs, its
  ``ModelConfig`` and its ``ScriptArguments`` (wherever the version keeps them);
- recipe frameworks (``name@commit=path`` of a source file): the dataclasses that extend a TRL or
  transformers class (``class SFTConfig(trl.SFTConfig)``) or are named ``*Arguments``, whose own
  fields recipes add (an older commit too, where the corpus still has recipes written for it).
Each key records the versions that have it (planner/check/recipe_keys.py reads the file).
"""

import ast
import json
import re
import sys
import zipfile
from pathlib import Path

TRL_FILES = re.compile(r"^trl/(trainer/[a-z_]*config\.py|trainer/utils\.py|utils\.py|scripts/utils\.py|"
                       r"commands/cli_utils\.py|trainer/model_config\.py)$")


def dataclass_fields(source: str, keep) -> set[str]:
    """Field names of the dataclasses in ``source`` whose class node ``keep`` accepts, and of those
    that extend a kept class of the same file."""
    fields = set()
    classes = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)]
    kept = {n.name for n in classes if keep(n)}
    while grown := {n.name for n in classes if n.name not in kept and {ast.unparse(b) for b in n.bases} & kept}:
        kept |= grown
    for node in classes:
        if node.name not in kept:
            continue
        decorators = {ast.unparse(d).split("(")[0] for d in node.decorator_list}
        if not decorators & {"dataclass", "dataclasses.dataclass"}:
            continue
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                if not item.target.id.startswith("_"):
                    fields.add(item.target.id)
    return fields


def _named(node: ast.ClassDef) -> bool:
    return node.name.endswith(("Config", "Arguments"))


def _framework(node: ast.ClassDef) -> bool:
    """A recipe framework's top-level arguments: a class extending TRL's or transformers', or its
    own ``*Arguments`` (not the dataset entries nested under a mixture)."""
    return node.name.endswith("Arguments") or any(ast.unparse(b).startswith(("trl.", "transformers."))
                                                   for b in node.bases)


def from_wheel(path: Path) -> tuple[str, str, set[str]]:
    """(library, version, keys) of a transformers or TRL wheel."""
    library, version = path.name.split("-")[:2]
    keys: set[str] = set()
    with zipfile.ZipFile(path) as z:
        for name in z.namelist():
            if library == "transformers" and name == "transformers/training_args.py":
                keys |= dataclass_fields(z.read(name).decode(), lambda n: n.name == "TrainingArguments")
            elif library == "trl" and TRL_FILES.match(name):
                keys |= dataclass_fields(z.read(name).decode(), _named)
    if not keys:
        raise SystemExit(f"{path.name}: no dataclass fields found")
    return library, version, keys


def main() -> None:
    out_path, inputs = Path(sys.argv[1]), sys.argv[2:]
    found: dict[str, dict[str, set[str]]] = {}
    for item in inputs:
        if item.endswith(".whl"):
            library, version, keys = from_wheel(Path(item))
        else:  # name@commit=path: a recipe framework's configs
            label, path = item.split("=", 1)
            library, version = label.split("@")
            keys = dataclass_fields(Path(path).read_text(), _framework)
        found.setdefault(library, {})[version] = keys
    data: dict = {"source": "tests/tools/recipe_keys.py over the released sources of each version"}
    for library, by_version in sorted(found.items()):
        numbered = all(re.fullmatch(r"[\d.]+", v) for v in by_version)  # (commits: in the order given, oldest first)
        versions = sorted(by_version, key=lambda v: [int(x) for x in v.split(".")]) if numbered else list(by_version)
        every = sorted(set().union(*by_version.values()))
        data[library] = {"versions": versions,
                         "keys": {k: [i for i, v in enumerate(versions) if k in by_version[v]] for k in every}}
    out_path.write_text(json.dumps(data, indent=0, sort_keys=True, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
