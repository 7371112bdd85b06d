"""Add LLaMA-Factory's and axolotl's key sets to planner/catalog/data/recipe_keys.json, per release,
read from their git histories without importing them.

    python tests/tools/framework_keys.py planner/catalog/data/recipe_keys.json \\
        /work/.mirror/hiyouga+LLaMA-Factory/repo /work/.mirror/axolotl-ai-cloud+axolotl/repo

- LLaMA-Factory: ``llamafactory-cli train`` parses a YAML with HfArgumentParser into the classes of
  ``_TRAIN_ARGS`` (src/llamafactory/hparams/parser.py): its ModelArguments, DataArguments,
  FinetuningArguments, GeneratingArguments and its TrainingArguments mixins, each with the bases
  it defines in src/llamafactory/hparams/. Fields with ``init=False`` are not keys (``parse_dict``
  takes init fields only). transformers' own (Seq2Seq)TrainingArguments fields are the
  "transformers" entry, plus the five Seq2Seq fields (transformers/training_args_seq2seq.py).
- axolotl: the fields and pydantic aliases of ``AxolotlConfigWCapabilities`` and every base it
  has in src/axolotl/utils/schemas/ (v0.6.0: src/axolotl/utils/config/models/input/v0_4_1/).
Each key records the releases that have it (planner/check/recipe_keys.py reads the file).
"""

import ast
import json
import subprocess
import sys

LLAMAFACTORY = ("v0.8.3", "v0.9.0", "v0.9.1", "v0.9.2", "v0.9.3", "v0.9.4", "v0.9.5", "ff6d4d12eeb0")
AXOLOTL = ("v0.6.0", "v0.8.0", "v0.10.0", "v0.12.0", "v0.14.0", "v0.16.0", "v0.18.0", "067b021c8b87")
SEQ2SEQ = ("sortish_sampler", "predict_with_generate", "generation_max_length", "generation_num_beams",
           "generation_config")


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=True).stdout


def _classes(repo: str, rev: str, folder: str) -> dict[str, ast.ClassDef]:
    out = {}
    for path in _git(repo, "ls-tree", "-r", "--name-only", rev, folder).split():
        if path.endswith(".py"):
            out |= {n.name: n for n in ast.parse(_git(repo, "show", f"{rev}:{path}")).body if isinstance(n, ast.ClassDef)}
    return out


def _keys_of(classes: dict[str, ast.ClassDef], root: str, seen: set[str]) -> set[str]:
    """The init fields and aliases of ``root`` and of its bases defined in ``classes``."""
    if root in seen or root not in classes:
        return set()
    seen.add(root)
    node, keys = classes[root], set()
    for base in node.bases:
        keys |= _keys_of(classes, ast.unparse(base), seen)
    for item in node.body:
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
            continue
        name = item.target.id
        if name.startswith("_") or name == "model_config" or "ClassVar" in ast.unparse(item.annotation):
            continue
        calls = [c for c in ast.walk(item) if isinstance(c, ast.Call) and ast.unparse(c.func).split(".")[-1] in ("field", "Field")]
        words = {kw.arg: kw.value for c in calls for kw in c.keywords}
        if isinstance(words.get("init"), ast.Constant) and words["init"].value is False:
            continue
        keys.add(name)
        for arg in ("alias", "validation_alias"):
            keys |= {c.value for c in ast.walk(words[arg]) if isinstance(c, ast.Constant) and isinstance(c.value, str)} \
                if arg in words else set()
    return keys


def llamafactory(repo: str, rev: str) -> set[str]:
    classes = _classes(repo, rev, "src/llamafactory/hparams/")
    parser = ast.parse(_git(repo, "show", f"{rev}:src/llamafactory/hparams/parser.py"))
    roots = next(ast.unparse(n.value).strip("[]").replace(" ", "").split(",") for n in parser.body
                 if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "_TRAIN_ARGS" for t in n.targets))
    seen: set[str] = set()
    return set().union(*(_keys_of(classes, root, seen) for root in roots))


def axolotl(repo: str, rev: str) -> set[str]:
    tree = _git(repo, "ls-tree", "-r", "--name-only", rev, "src/axolotl/utils/")
    folder = "src/axolotl/utils/schemas/" if "src/axolotl/utils/schemas/config.py" in tree else \
        "src/axolotl/utils/config/models/input/v0_4_1/"
    return _keys_of(_classes(repo, rev, folder), "AxolotlConfigWCapabilities", set())


def entry(versions: tuple[str, ...], sets: list[set[str]]) -> dict:
    keys = sorted(set().union(*sets))
    return {"versions": list(versions), "keys": {k: [i for i, s in enumerate(sets) if k in s] for k in keys}}


def main(out: str, lf_repo: str, ax_repo: str) -> None:
    data = json.loads(open(out).read())
    lf = [llamafactory(lf_repo, v) | set(SEQ2SEQ) for v in LLAMAFACTORY]
    ax = [axolotl(ax_repo, v) for v in AXOLOTL]
    data["llamafactory"], data["axolotl"] = entry(LLAMAFACTORY, lf), entry(AXOLOTL, ax)
    data["source"] = data["source"].split(" LLaMA-Factory")[0] + (
        f" LLaMA-Factory {LLAMAFACTORY[0]} to @{LLAMAFACTORY[-1]} and axolotl {AXOLOTL[0]} to @{AXOLOTL[-1]}: "
        "tests/tools/framework_keys.py from their git histories.")
    open(out, "w").write(json.dumps(data, indent=0, sort_keys=True, separators=(",", ":")) + "\n")  # (as recipe_keys.py)
    print({"llamafactory": [len(s) for s in lf], "axolotl": [len(s) for s in ax]})


if __name__ == "__main__":
    main(*sys.argv[1:4])
