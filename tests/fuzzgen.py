"""A mutation fuzzer of every file planner reads, with a fixed seed (issue 40).

Seeds are real files: what planner itself writes for the tiny Llama (plan.json, runtime.json,
accelerate_config.yaml, deepspeed_config.json, training_args.json), the catalog's GPU files, the
tiny model's config.json, and public job files from tests/data/recipes. Each case mutates one seed
(a key removed or renamed, a value replaced by a hostile one, a subtree nested thousands deep or
repeated, the text truncated, bytes that are not UTF-8, a YAML alias bomb, a BOM, NUL) or replaces
its path (a FIFO, a directory, a device, a dangling or looping link, an over-long or escape-laden
name), then runs the command that reads it in process (typer's CliRunner):

- ``emit --plan`` (plan.json, a suggest/estimate result), ``check --job-dir`` (a job folder),
- ``estimate --gpus 1x<file>`` (a custom GPU), ``estimate --model <folder>`` (a model's config.json),
- ``check --accelerate-config / --deepspeed-config / --training-args / --runtime-args``,
- ``estimate --calibration`` (a store whose corrections row is mutated, or its bytes), and
  ``estimate --model org/name`` from a local Hugging Face cache (``HF_HUB_CACHE``) with its ref,
  snapshot or layout mutated.

A case passes when the command ends as documented: exit 0, 1 or 2, no exception but SystemExit, no
traceback, a message that is not empty, at most ``MAX_MESSAGE`` characters (a screen
``MAX_SCREEN``), no terminal escape
sequence (ESC) that the user's input brought, within ``TIME_LIMIT`` seconds. tests/test_fuzz.py runs a
few thousand cases in CI; benchmarks/fuzz.py the thorough profile (>= 20,000).
"""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
import signal
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "tests" / "data" / "tiny-llama"
RECIPES = ROOT / "tests" / "data" / "recipes"
#: An error message longer than this is a wall of text, not a message (a repeated input echoed
#: whole); a screen (a plan, a check's report: tables and notes) is longer, within MAX_SCREEN.
#: Both counted without the spaces that pad a line.
MAX_MESSAGE = 6_000
MAX_SCREEN = 20_000
#: Seconds one in-process command may take before it counts as a hang.
TIME_LIMIT = 20

HOSTILE_VALUES: list = [
    None, True, False, 0, -1, 1, 2, 3, 7, 2**31, 2**63, -(2**63), 10**30, 10**400, 1e308, -1e308, 1e-320, 0.5,
    float("nan"), float("inf"), float("-inf"), "", " ", "0", "-1", "1e400", "nan", "auto", "none", "true", "x" * 300,
    "\x1b[31mred\x1b[0m", "\x1b]0;title\x07", "a\nb", "é", "\u202e", "１２", "0x10", "../../etc/passwd", [], {}, [1, 2],
    {"a": 1}, [[[]]], ["auto"], {"enabled": True}, "bf16", "fp16", "zero3", "cpu",
]


@dataclass
class Case:
    """One fuzz input: the command line (``{x}`` placeholders are paths made by ``files``) and the
    files it reads."""

    target: str
    mutation: str
    args: list[str]
    files: dict[str, bytes] = field(default_factory=dict)  # relative path -> bytes
    special: dict[str, str] = field(default_factory=dict)  # relative path -> fifo | dir | dev | loop | dangling
    env: dict[str, str] = field(default_factory=dict)  # environment of the command ({x}: paths, as in args)


def _seed_folder(work: Path) -> dict[str, Path]:
    """planner's own files for the tiny Llama: one ZeRO-2 plan (its DeepSpeed JSON) and one FSDP2 plan."""
    from typer.testing import CliRunner

    from planner.cli import app

    out = {}
    for name, extra in (("zero", ["--sharding", "zero2"]), ("fsdp", ["--sharding", "fsdp"])):
        folder = work / f"seed-{name}"
        r = CliRunner().invoke(app, ["suggest", "--model", str(TINY), "--gpus", "2xA100-80", "--seq-len", "64",
                                     *extra, "--out", str(folder)])
        assert r.exit_code == 0, r.output
        out[name] = folder
    return out


def seeds(work: Path) -> dict[str, list[tuple[str, bytes]]]:
    """Per file kind, (name, bytes) of the real files a mutation starts from."""
    folders = _seed_folder(work)
    kinds: dict[str, list[tuple[str, bytes]]] = {k: [] for k in
                                                 ("plan", "runtime", "accelerate", "deepspeed", "training", "gpu",
                                                  "model", "torchtitan")}
    for folder in folders.values():
        for name, kind in (("plan.json", "plan"), ("runtime.json", "runtime"), ("accelerate_config.yaml", "accelerate"),
                           ("deepspeed_config.json", "deepspeed"), ("training_args.json", "training")):
            if (folder / name).exists():
                kinds[kind].append((name, (folder / name).read_bytes()))
    gpus = sorted((ROOT / "planner" / "catalog" / "data" / "gpus").glob("*.yaml"))
    kinds["gpu"] = [(p.name, p.read_bytes()) for p in gpus[::4]]
    kinds["model"] = [("config.json", (TINY / "config.json").read_bytes())]
    kinds["store"] = [("corrections.json", json.dumps(CORRECTIONS).encode())]
    for path in sorted(RECIPES.rglob("*")):
        if not path.is_file() or path.stat().st_size > 20_000:
            continue
        text = path.read_bytes()
        if path.suffix in (".yaml", ".yml") and b"distributed_type" in text:
            kinds["accelerate"].append((path.name, text))
        elif path.suffix == ".json" and b"zero_optimization" in text:
            kinds["deepspeed"].append((path.name, text))
        elif path.suffix in (".yaml", ".yml", ".json"):
            kinds["training"].append((path.name, text))
        elif path.suffix == ".toml":
            kinds["torchtitan"].append((path.name, text))
    return kinds


#: The body of a calibration store's row of fitted corrections for the GPU the fuzzed commands name.
CORRECTIONS = {"gpu": "A100-SXM-80", "software": "torch 2.13.0", "measurements": 3, "context_bytes": 600_000_000,
               "fragmentation_fraction": 0.05, "flops_scale": {"bf16": 0.9}, "cpu_optimizer_params_per_s": {},
               "fitted_at": "2026-11-29T00:00:00", "report": {}}


def store_bytes(body: bytes) -> bytes:
    """A calibration store (planner/catalog/calibration.py's tables) holding ``body`` as its
    corrections row for A100-SXM-80."""
    import sqlite3
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "store.sqlite"
        con = sqlite3.connect(path)
        con.executescript("CREATE TABLE measurements (architecture TEXT, plan TEXT, gpu TEXT, software TEXT, "
                          "status TEXT, created TEXT, body TEXT, PRIMARY KEY (architecture, plan, gpu, software));"
                          "CREATE TABLE corrections (gpu TEXT PRIMARY KEY, body TEXT);"
                          "CREATE TABLE host_rates (gpu TEXT PRIMARY KEY, body TEXT);")
        with con:
            con.execute("INSERT INTO corrections VALUES (?, ?)", ("A100-SXM-80", body.decode("utf-8", "replace")))
        con.close()
        return path.read_bytes()


def _load(name: str, data: bytes):
    text = data.decode("utf-8", "replace")
    if name.endswith(".toml"):
        return tomllib.loads(text)
    return json.loads(text) if name.endswith(".json") else yaml.safe_load(text)


def _dump(name: str, tree) -> bytes:
    if name.endswith(".json"):
        return json.dumps(tree, allow_nan=True).encode()
    if name.endswith(".toml"):
        return _toml(tree).encode()
    return yaml.safe_dump(tree, allow_unicode=True).encode()


def _toml(tree) -> str:
    """A tree as TOML: each top-level key ``key = value``, tables inline (``{a = 1}``), keys quoted;
    None (TOML has no null) as an empty table; a root that is no table as one such line."""
    def value(v) -> str:
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(str(k))} = {value(x)}" for k, x in v.items()) + "}"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v) if v == v else "nan"
        return "{}" if v is None else json.dumps(str(v), ensure_ascii=False)

    if not isinstance(tree, dict):
        return f"root = {value(tree)}\n"
    return "".join(f"{json.dumps(str(k))} = {value(v)}\n" for k, v in tree.items())


def _paths(tree, prefix=()) -> list[tuple]:
    """Every key path of a tree of dicts and lists."""
    out = [prefix]
    if isinstance(tree, dict):
        for k, v in tree.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree[:20]):
            out += _paths(v, (*prefix, i))
    return out


def _get(tree, path):
    for p in path:
        tree = tree[p]
    return tree


def _set(tree, path, value):
    if not path:
        return value
    _get(tree, path[:-1])[path[-1]] = value
    return tree


NEST = "__nested_here__"


def _tree_mutation(rng: random.Random, name: str, data: bytes) -> tuple[str, bytes]:
    tree = _load(name, data)
    paths = _paths(tree)
    path = rng.choice(paths)
    kind = rng.choice(["value", "value", "value", "delete", "rename", "nest", "repeat", "wrap", "root"])
    tree = copy.deepcopy(tree)
    if kind == "root":
        tree = rng.choice(HOSTILE_VALUES)
    elif kind == "value" or not path:
        tree = _set(tree, path, rng.choice(HOSTILE_VALUES))
    elif kind == "delete":
        parent = _get(tree, path[:-1])
        del parent[path[-1]]
    elif kind == "rename":
        parent = _get(tree, path[:-1])
        if isinstance(parent, dict):
            parent[rng.choice(["x", "\x1b[2J", "é" * 3, "k" * 30_000, str(path[-1]).upper(),
                               f"{path[-1]}_"])] = parent.pop(path[-1])
    elif kind == "nest":  # written as text: the dumpers recurse too
        depth = rng.choice([50, 900, 3000, 60000])
        opening, closing = ("[" * depth, "]" * depth) if rng.random() < 0.5 else ('{"a": ' * depth, "}" * depth)
        text = _dump(name, _set(tree, path, NEST)).decode()
        return "tree-nest", text.replace(f'"{NEST}"', NEST).replace(NEST, opening + "1" + closing, 1).encode()
    elif kind == "repeat":
        tree = _set(tree, path, [_get(tree, path)] * rng.choice([1000, 20000]))
    elif kind == "wrap":
        tree = _set(tree, path, [_get(tree, path)])
    return f"tree-{kind}", _dump(name, tree)


def _text_mutation(rng: random.Random, name: str, data: bytes) -> tuple[str, bytes]:
    kind = rng.choice(["truncate", "bytes", "bom", "nul", "empty", "alias", "tabs", "huge"])
    if kind == "truncate":
        return kind, data[: rng.randrange(len(data) + 1)]
    if kind == "bytes":
        at = rng.randrange(len(data) + 1)
        return kind, data[:at] + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8))) + data[at:]
    if kind == "bom":
        return kind, b"\xef\xbb\xbf" + data
    if kind == "nul":
        return kind, data + b"\x00"
    if kind == "empty":
        return kind, b""
    if kind == "alias":  # a billion laughs in YAML (JSON readers see a syntax error)
        lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
        for i in range(1, 9):
            lines.append(f"{chr(97 + i)}: &{chr(97 + i)} [" + ", ".join([f"*{chr(96 + i)}"] * 9) + "]")
        return kind, "\n".join(lines).encode() + b"\n"
    if kind == "tabs":
        return kind, data.replace(b"  ", b"\t")
    return kind, data * rng.choice([50, 400])


def _bytes_mutation(rng: random.Random, name: str, data: bytes) -> tuple[str, bytes]:
    try:
        _load(name, data)
        parsed = True
    except Exception:  # a seed YAML with tags, say: text mutations only
        parsed = False
    if parsed and rng.random() < 0.7:
        return _tree_mutation(rng, name, data)
    return _text_mutation(rng, name, data)


SPECIALS = ["fifo", "dir", "dev", "loop", "dangling"]


TARGETS = ("plan", "jobdir", "gpu", "model", "accelerate", "deepspeed", "training", "runtime", "store", "hfcache",
           "torchtitan")


def cases(kinds: dict[str, list[tuple[str, bytes]]], count: int, seed: int = 0,
          targets: tuple[str, ...] = TARGETS) -> Iterator[Case]:
    """``count`` mutated cases of ``targets`` (all by default), reproducible from ``seed``."""
    rng = random.Random(seed)
    for _ in range(count):
        target = rng.choice(list(targets))
        special = rng.random() < 0.04
        if target == "hfcache":
            yield _hf_cache_case(rng, kinds["model"][0][1])
            continue
        if target == "jobdir":
            files = {}
            muted = rng.choice(["plan.json", "runtime.json", "accelerate_config.yaml", "training_args.json",
                                "deepspeed_config.json"])
            kind = {"plan.json": "plan", "runtime.json": "runtime", "accelerate_config.yaml": "accelerate",
                    "training_args.json": "training", "deepspeed_config.json": "deepspeed"}[muted]
            for fname, k in (("plan.json", "plan"), ("runtime.json", "runtime"), ("accelerate_config.yaml", "accelerate"),
                             ("training_args.json", "training")):
                files[f"job/{fname}"] = kinds[k][0][1]
            name, data = kinds[kind][0]
            mutation, files[f"job/{muted}"] = _bytes_mutation(rng, muted, data)
            args = ["check", "--job-dir", "{job}", "--model", str(TINY), "--gpus", "2xA100-80"]
            yield Case(target, f"{muted}:{mutation}", args, files)
            continue
        kind = target
        name, data = rng.choice(kinds[kind])
        fname = {"plan": "plan.json", "gpu": "lab.yaml", "model": "m/config.json",
                 "store": "store.sqlite"}.get(kind, name)
        if special:
            mutation, files, specials = "path", {}, {fname: rng.choice(SPECIALS)}
        elif kind == "store":  # the row's JSON mutated, or the database file's bytes
            mutation, body = _bytes_mutation(rng, name, data)
            body = store_bytes(body)
            if rng.random() < 0.3:
                mutation, body = _text_mutation(rng, fname, body)
            files, specials = {fname: body}, {}
        else:
            mutation, body = _bytes_mutation(rng, fname, data)
            files, specials = {fname: body}, {}
        ref = "{" + fname + "}"
        if kind == "plan":
            args = ["emit", "--plan", ref, "--out", "{out}"]
        elif kind == "gpu":
            args = ["estimate", "--model", str(TINY), "--gpus", "1x" + ref]
        elif kind == "model":
            args = ["estimate", "--model", "{m}", "--gpus", "1xA100-80"]
        elif kind == "store":
            args = ["estimate", "--model", str(TINY), "--gpus", "1xA100-80", "--calibration", ref]
        else:
            option = {"accelerate": "--accelerate-config", "deepspeed": "--deepspeed-config",
                      "training": "--training-args", "runtime": "--runtime-args",
                      "torchtitan": "--torchtitan-config"}[kind]
            args = ["check", "--model", str(TINY), "--gpus", "2xA100-80", option, ref]
        yield Case(target, f"{name}:{mutation}", args, files, specials)


def _hf_cache_case(rng: random.Random, config: bytes) -> Case:
    """A local Hugging Face cache (``HF_HUB_CACHE``) holding a model ``fuzz/m`` as huggingface_hub
    lays it out (refs/main naming a snapshot folder with config.json), one part of it mutated."""
    repo = "hub/models--fuzz--m"
    files = {f"{repo}/refs/main": b"abc123", f"{repo}/snapshots/abc123/config.json": config}
    specials: dict[str, str] = {}
    part = rng.choice(["ref", "ref", "config", "config", "layout"])
    if part == "ref":
        mutation = rng.choice(["bytes", "nul", "traversal", "huge", "empty", "special"])
        body = {"bytes": bytes(rng.randrange(256) for _ in range(12)), "nul": b"abc\x00123", "empty": b"",
                "traversal": b"../../../../etc", "huge": b"a" * 3_000_000, "special": b""}[mutation]
        if mutation == "special":
            del files[f"{repo}/refs/main"]
            specials[f"{repo}/refs/main"] = rng.choice(SPECIALS)
        else:
            files[f"{repo}/refs/main"] = body
    elif part == "config":
        if rng.random() < 0.3:
            mutation = "special"
            del files[f"{repo}/snapshots/abc123/config.json"]
            specials[f"{repo}/snapshots/abc123/config.json"] = rng.choice(SPECIALS)
        else:
            mutation, files[f"{repo}/snapshots/abc123/config.json"] = _bytes_mutation(rng, "config.json", config)
    else:
        mutation = rng.choice(["snapshots-file", "repo-file", "no-ref", "two-snapshots"])
        if mutation == "snapshots-file":
            files = {f"{repo}/refs/main": b"abc123", f"{repo}/snapshots": b"not a folder"}
        elif mutation == "repo-file":
            files = {repo: b"not a folder"}
        elif mutation == "no-ref":
            del files[f"{repo}/refs/main"]
        else:
            files[f"{repo}/snapshots/def456/config.json"] = b"{not json"
    return Case("hfcache", f"hf-cache {part}:{mutation}", ["estimate", "--model", "fuzz/m", "--gpus", "1xA100-80"],
                files, specials, {"HF_HUB_CACHE": "{hub}"})


def materialise(case: Case, folder: Path) -> list[str]:
    """Write the case's files under ``folder`` (emptied first); its command line with paths."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for rel, body in case.files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
    for rel, what in case.special.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if what == "fifo":
            os.mkfifo(path)
        elif what == "dir":
            path.mkdir()
        elif what == "dev":
            path.symlink_to("/dev/zero")
        elif what == "loop":
            path.symlink_to(path.name)
        else:
            path.symlink_to(folder / "missing")
    refs = {"job": folder / "job", "out": folder / "out", "m": folder / "m", "hub": folder / "hub"}
    refs |= {rel: folder / rel for rel in [*case.files, *case.special]}
    return [_fill(a, refs) for a in case.args]


def _fill(arg: str, refs: dict[str, Path]) -> str:
    for key, path in refs.items():
        arg = arg.replace("{" + key + "}", str(path))
    return arg


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang


_COMMAND: list = []  # planner's click command, built once (typer's CliRunner builds it anew per invoke)


def run(case: Case, folder: Path) -> str | None:
    """None when the command ended as documented, else what went wrong (one line)."""
    import typer.testing
    from typer.main import get_command

    from planner.cli import app

    if not _COMMAND:
        _COMMAND.append(get_command(app))
    args = materialise(case, folder)
    build, typer.testing._get_command = typer.testing._get_command, lambda _: _COMMAND[0]
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(TIME_LIMIT)
    start = time.perf_counter()
    try:
        env = {k: _fill(v, {"hub": folder / "hub"}) for k, v in case.env.items()}
        r = typer.testing.CliRunner().invoke(app, args, env=env or None)
    except _Hang:
        return f"hang: over {TIME_LIMIT} s"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        typer.testing._get_command = build
    if isinstance(r.exception, _Hang):
        return f"hang: over {TIME_LIMIT} s"
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        tb = r.exc_info[2] if r.exc_info else None
        where = ""
        while tb is not None:
            frame = tb.tb_frame.f_code
            if "planner" in frame.co_filename or "strategies" in frame.co_filename:
                where = f"{Path(frame.co_filename).name}:{tb.tb_lineno}"
            tb = tb.tb_next
        return f"{type(r.exception).__name__} at {where}: {str(r.exception)[:120]}"
    if r.exit_code not in (0, 1, 2):
        return f"exit {r.exit_code}"
    out = r.output
    if "Traceback" in out:
        return "traceback printed"
    if not out.strip() or out.strip() in ("error:", "error: --:"):
        return "empty message"
    shown = sum(len(line.rstrip()) for line in out.splitlines())
    if shown > (MAX_MESSAGE if r.exit_code == 2 else MAX_SCREEN):
        return f"{'message' if r.exit_code == 2 else 'screen'} of {shown:,} characters"
    if "\x1b" in out:
        return "an escape sequence echoed"
    if time.perf_counter() - start > TIME_LIMIT:
        return f"slow: over {TIME_LIMIT} s"
    return None


# -- the planner launch (python -m planner.launch), in process ------------------------------------

LAUNCH_FILES = ("runtime.json", "plan.json", "training_args.json", "accelerate_config.yaml")


def launch_cases(kinds: dict[str, list[tuple[str, bytes]]], count: int, seed: int = 0) -> Iterator[Case]:
    """A plan folder for the tiny Llama (one GPU, planner's own files) with one file mutated or
    replaced by a FIFO or a directory, launched on the tiny model folder for one step."""
    rng = random.Random(seed)
    seed_files = {name: data for name, data in kinds["single"]}
    for _ in range(count):
        muted = rng.choice(LAUNCH_FILES)
        files = {f"job/{name}": data for name, data in seed_files.items()}
        if rng.random() < 0.05:
            del files[f"job/{muted}"]
            specials, mutation = {f"job/{muted}": rng.choice(["fifo", "dir"])}, f"{muted}:path"
        else:
            kind, files[f"job/{muted}"] = _bytes_mutation(rng, muted, seed_files[muted])
            specials, mutation = {}, f"{muted}:{kind}"
        yield Case("launch", mutation, ["--job-dir", "{job}", "--model", "{tiny_model}", "--data", "sample",
                                        "--max-steps", "1", "--no-save", "--output-dir", "{out}"], files, specials)


def launch_seeds(work: Path) -> list[tuple[str, bytes]]:
    """planner's files of a one-GPU plan of the tiny Llama (what launch.sh would run)."""
    from typer.testing import CliRunner

    from planner.cli import app

    folder = work / "seed-single"
    r = CliRunner().invoke(app, ["estimate", "--model", str(TINY), "--gpus", "1xA100-80", "--seq-len", "64",
                                 "--micro-batch-size", "2", "--json"])
    assert r.exit_code == 0, r.output
    (work / "single.json").write_text(r.output)
    r = CliRunner().invoke(app, ["emit", "--plan", str(work / "single.json"), "--out", str(folder)])
    assert r.exit_code == 0, r.output
    return [(name, (folder / name).read_bytes()) for name in LAUNCH_FILES if (folder / name).exists()]


def run_launch(case: Case, folder: Path, tiny_model: Path) -> str | None:
    """None when ``python -m planner.launch`` (its main, in process) ended as documented: exit 0,
    1 or 2 with its message, no other exception."""
    import contextlib
    import io

    from planner.launch.train import main

    args = [_fill(a, {"tiny_model": tiny_model}) for a in materialise(case, folder)]
    err = io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(TIME_LIMIT * 3)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            main(args)
        code: object = 0
    except SystemExit as e:
        code = e.code
    except _Hang:
        return f"hang: over {TIME_LIMIT * 3} s"
    except Exception as e:  # noqa: BLE001 - what the fuzzer looks for
        tb, where = e.__traceback__, ""
        while tb is not None:
            if "planner" in tb.tb_frame.f_code.co_filename:
                where = f"{Path(tb.tb_frame.f_code.co_filename).name}:{tb.tb_lineno}"
            tb = tb.tb_next
        return f"{type(e).__name__} at {where}: {str(e)[:120]}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    if code not in (0, 1, 2, None):
        return f"exit {code}"
    if code == 2 and not err.getvalue().strip():
        return "empty message"
    if "Traceback" in err.getvalue():
        return "traceback printed"
    return None
