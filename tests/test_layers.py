"""The import rules of DESIGN.md's layer table, checked on the source."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = {"planner.core.units", "planner.core.errors", "planner.core.vocabulary", "planner.core.specs", "planner.core.ledger",
        "planner.core.formatting", "planner"}
HEAVY = {"torch", "transformers", "accelerate", "deepspeed", "optuna", "bitsandbytes"}


def imports(path: Path, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def ours(names: set[str]) -> set[str]:
    return {n for n in names if n.split(".")[0] in ("planner", "strategies", "probes")}


def heavy(names: set[str]) -> set[str]:
    return {n for n in names if n.split(".")[0] in HEAVY}


def test_layers():
    problems = []
    for path in sorted([*ROOT.glob("planner/**/*.py"), *ROOT.glob("strategies/**/*.py")]):
        name = module_name(path)
        everywhere, top = imports(path, False), imports(path, True)
        if name in CORE:
            bad = ours(everywhere) - CORE | heavy(everywhere)
        elif name.startswith("planner.catalog"):
            bad = {n for n in ours(everywhere) if not (n in CORE or n.startswith("planner.catalog"))} | heavy(everywhere)
        elif name.startswith("planner.cost"):
            bad = {n for n in ours(everywhere) if not (n in CORE or n.startswith(("planner.catalog", "planner.cost")))}
            bad |= heavy(everywhere)
        elif name.startswith("strategies"):
            bad = {n for n in ours(everywhere) if n.startswith("probes")} | heavy(everywhere)
        else:  # search, emit, preflight, report, cli: no heavy import at module level, no probes there
            bad = heavy(top) | {n for n in ours(top) if n.startswith("probes")}
        if bad:
            problems.append(f"{name} imports {sorted(bad)}")
    assert not problems, problems
