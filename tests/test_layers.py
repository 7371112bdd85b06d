"""The import rules of DESIGN.md's layer table, by package prefix, checked on the source.

| layer      | packages                         | may import of ours                         | heavy (torch, ...) |
| core       | planner.core, planner            | core                                       | never              |
| catalogs   | planner.catalog                  | core, catalogs                             | never              |
| cost       | planner.cost                     | core, catalogs, cost                       | never              |
| strategies | strategies                       | core, cost, strategies                     | never              |
| schema     | planner.schema                   | core, catalogs, cost, strategies, schema   | never              |
| engine     | planner.engine                   | the above, engine                          | not at module level|
| emit       | planner.emit                     | the above, emit                            | not at module level|
| check      | planner.check                    | the above, check                           | not at module level|
| render     | planner.render                   | core, catalogs, cost, strategies, schema, render | not at module level|
| runtime    | planner.runtime                  | core, catalogs, strategies, runtime        | not at module level|
| launch     | planner.launch                   | all but render, cli and probes             | not at module level|
| probes     | probes                           | all but check, render and cli              | yes                |
| cli        | planner.cli                      | everything; probes only inside functions   | not at module level|

"The above" is every earlier row. The engine takes probes as functions; renderers take the schema's
results and never the engine that computes them; the runtime is what a training process imports with the plan; the launch is
the training process's entry point (it reads the files with check's reader and applies the runtime).
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = {"torch", "transformers", "accelerate", "deepspeed", "optuna", "bitsandbytes", "torchao", "peft", "trl"}
ORDER = ("planner.core", "planner.catalog", "planner.cost", "planner.strategies", "planner.schema", "planner.engine",
         "planner.emit", "planner.check", "planner.render")
ALLOWED: dict[str, set[str]] = {layer: set(ORDER[: i + 1]) for i, layer in enumerate(ORDER)}
ALLOWED["planner.strategies"] = {"planner.core", "planner.cost", "planner.strategies"}
ALLOWED["planner.render"] = {"planner.core", "planner.catalog", "planner.cost", "planner.strategies", "planner.schema",
                             "planner.render"}
ALLOWED["planner.runtime"] = {"planner.core", "planner.catalog", "planner.strategies", "planner.runtime"}
ALLOWED["planner.launch"] = set(ORDER) - {"planner.render"} | {"planner.runtime", "planner.launch"}
ALLOWED["planner.probes"] = set(ORDER) - {"planner.check", "planner.render"} | {"planner.runtime", "planner.probes"}
ALLOWED["planner.cli"] = set(ORDER) | {"planner.runtime", "planner.cli", "planner.probes"}
#: Layers that may import heavy packages at module level.
HEAVY_AT_TOP = {"planner.probes"}
#: Layers that import nothing heavy, not even inside a function.
NEVER_HEAVY = {"planner.core", "planner.catalog", "planner.cost", "planner.strategies", "planner.schema"}


def imports(path: Path, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            if node.module == "planner":  # from planner import runtime
                out |= {f"planner.{a.name}" for a in node.names}
    return out


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    if parts[0] in ("strategies", "probes"):  # the repository's folders install as planner.strategies, planner.probes
        parts = ("planner", *parts)
    return ".".join(parts)


def layer_of(name: str) -> str | None:
    if name in ("planner", "planner.__init__"):
        return "planner.core"
    if name == "planner.__main__":  # python -m planner: the command line
        return "planner.cli"
    for layer in (*ORDER, "planner.runtime", "planner.launch", "planner.cli", "planner.probes"):
        if name == layer or name.startswith(layer + "."):
            return layer
    return None


def sources() -> list[Path]:
    return sorted(p for pattern in ("planner/**/*.py", "strategies/**/*.py", "probes/**/*.py")
                  for p in ROOT.glob(pattern))


def test_every_module_belongs_to_a_layer():
    assert not [module_name(p) for p in sources() if layer_of(module_name(p)) is None]


def test_layers():
    problems = []
    for path in sources():
        name = module_name(path)
        layer = layer_of(name)
        everywhere, top = imports(path, False), imports(path, True)
        ours = {n for n in everywhere if layer_of(n) is not None}
        bad = {n for n in ours if layer_of(n) not in ALLOWED[layer]}
        if layer == "planner.cli":  # probes only inside the commands that need them
            bad |= {n for n in top if layer_of(n) == "planner.probes"}
        heavy = everywhere if layer in NEVER_HEAVY else top if layer not in HEAVY_AT_TOP else set()
        bad |= {n for n in heavy if n.split(".")[0] in HEAVY}
        if bad:
            problems.append(f"{name} ({layer}) imports {sorted(bad)}")
    assert not problems, "\n".join(problems)


def test_the_rules_catch_a_violation(tmp_path):
    """The checker itself: a strategy importing torch or the engine, and the CLI importing probes at
    module level, are caught (a test that cannot fail proves nothing)."""
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nfrom planner.engine.estimate import evaluate\n")
    found = imports(bad, False)
    assert {n for n in found if n.split(".")[0] in HEAVY} == {"torch"}
    assert {layer_of(n) for n in found if layer_of(n)} - ALLOWED["planner.strategies"] == {"planner.engine"}
    assert "planner.probes" not in ALLOWED["planner.runtime"] and "planner.engine" not in ALLOWED["planner.runtime"]


def _table(text: str, layer_col: int, imports_col: int) -> dict[str, set[str]]:
    """layer -> what it may import, as words (its own layer left out) from a markdown table."""
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > max(layer_col, imports_col) and cells[layer_col] and cells[layer_col] not in ("layer", "---"):
            layer = cells[layer_col]
            words = {w.strip() for w in cells[imports_col].replace(";", ",").replace(" and ", ",").split(",")} - {layer, ""}
            out[layer] = words
    return out


def test_the_architecture_page_states_this_table():
    """docs/architecture.md's layer table says what this test enforces (one table is the truth)."""
    ours = _table(__doc__, 0, 2)
    page = _table((ROOT / "docs" / "architecture.md").read_text().split("## Layers")[1].split("\n## ")[0], 0, 3)
    assert set(page) == set(ours)
    assert page == ours
