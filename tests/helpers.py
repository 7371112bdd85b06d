"""What tests share: estimating a configuration from strings, hypothesis example counts, and
which tests CI runs (the full suite's marker, ``FULL``)."""

import itertools
import os

import pytest

from planner.catalog.gpus import parse_gpus
from planner.catalog.models import resolve_model
from planner.engine.estimate import estimate_config
from planner.strategies import TrainingConfig

#: Hypothesis: the ``ci`` profile (default) runs each property test with an eighth of its examples
#: (at least 50); PLANNER_HYPOTHESIS=thorough runs them all. A test states its thorough count
#: through ``examples(n)``.
HYPOTHESIS_PROFILE = os.environ.get("PLANNER_HYPOTHESIS", "ci")


#: The full suite (PLANNER_FULL_SUITE=1, benchmarks/full_suite.sh) runs every test; CI leaves out
#: those marked ``FULL`` (tests/conftest.py), each the slower twin of a CI test that covers the same
#: capability: CI stays inside its time on a 2-core machine.
FULL_SUITE = os.environ.get("PLANNER_FULL_SUITE") == "1"
#: The tiny Llama TRL's trainers run in the CPU tests (conftest.py's ``tiny``: its fp32 model folder).
TINY_TRL = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 4096, "max_position_embeddings": 512,
            "tie_word_embeddings": False}
FULL = pytest.mark.full


def covering(*axes, flatten: bool = False) -> list:
    """The product of ``axes`` as pytest params, every row but a covering subset marked ``FULL``:
    rows chosen greedily (the first in product order among those covering the most) until every
    value of every axis is in one. CI runs each value once; the full suite every combination.
    ``flatten``: an axis value that is a tuple gives its items as separate arguments."""
    rows = list(itertools.product(*axes))
    needed = {(i, v) for i, axis in enumerate(axes) for v in axis}
    chosen = set()
    while needed:
        best = max(rows, key=lambda r: len(set(enumerate(r)) & needed))
        chosen.add(best)
        needed -= set(enumerate(best))

    def args(row: tuple) -> list:
        return [x for v in row for x in (v if flatten and isinstance(v, tuple) else (v,))]

    return [pytest.param(*args(r), marks=() if r in chosen else FULL) for r in rows]


def postgres_server_bin(name: str) -> str | None:
    """A PostgreSQL server program (initdb, pg_ctl) on PATH or in Debian's /usr/lib/postgresql/N/bin."""
    import shutil
    from pathlib import Path

    found = shutil.which(name)
    if found:
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    return str(versions[-1]) if versions else None


def postgres_testable() -> bool:
    """Whether tests/test_tune_postgres.py can run here: a server and the psycopg2 driver."""
    import importlib.util

    return bool(postgres_server_bin("initdb") and postgres_server_bin("pg_ctl")
                and importlib.util.find_spec("psycopg2"))


def examples(thorough: int, ci: int | None = None) -> int:
    """Examples for a property test: ``thorough`` under the thorough profile; in CI ``ci``, else an
    eighth of it (at least 50)."""
    if HYPOTHESIS_PROFILE == "thorough":
        return thorough
    return ci if ci is not None else min(thorough, max(50, thorough // 8))


def run(model: str, gpus: str, host_memory_gb: float | None = None, margin: float = 0.0,
        inter_node_gbps: float | None = None, page_migration_gb_s: float | None = None,
        cpu_optimizer_gparams_s: float | None = None, **config):
    """Estimate one configuration from strings, the way the CLI resolves them."""
    hardware = parse_gpus(gpus, host_memory_gb, inter_node_gbps, page_migration_gb_s=page_migration_gb_s,
                          cpu_optimizer_gparams_s=cpu_optimizer_gparams_s)
    return estimate_config(resolve_model(model), hardware, TrainingConfig(**config), margin)


#: The emitted files a launch reads (plan.json and PLAN.md are for people; launch.sh only starts it).
LAUNCH_FILES = ("accelerate_config.yaml", "deepspeed_config.json", "training_args.json", "runtime.json")


def round_trip(plan, out, gpus: str | None = None):
    """``planner check`` on the launch files ``plan`` emits, alone, written to ``out``: the
    CheckResult (no alternatives searched)."""
    from planner.check import CheckRequest, check
    from planner.emit import build_files, single_plan_result

    out.mkdir(parents=True, exist_ok=True)
    for name, text in build_files(single_plan_result(plan)).items():
        if name in LAUNCH_FILES:
            (out / name).write_text(text)
    return check(CheckRequest(model=plan.model.id, gpus=gpus or plan.hardware.spec, job_dir=out, alternatives=0,
                              host_memory_gb=plan.hardware.host_memory_bytes_per_node / 1e9))


#: Fields no training job's files hold: the vLLM server's GPUs and tensor parallelism (``trl
#: vllm-serve`` runs beside the training processes; ``planner check --vllm-gpus`` says how many).
OUTSIDE_THE_FILES = frozenset({"vllm_gpus", "vllm_tp"})


def round_trip_errors(plan, result) -> list[str]:
    """What a round trip got wrong: every field the files left to a default, every field read
    differently, and a peak more than 0.5 % away."""
    errors = [f"{k}: from a default, not the files" for k, v in result.sources.items()
              if v == "default" and k not in OUTSIDE_THE_FILES]
    got = result.estimate.config
    errors += [f"{k}: planned {getattr(plan.config, k)}, read {getattr(got, k)} ({result.sources.get(k)})"
               for k in type(plan.config).model_fields if getattr(got, k) != getattr(plan.config, k)]
    a, b = plan.memory["peak"], result.estimate.memory["peak"]
    if abs(b - a) > 0.005 * a:
        errors.append(f"peak: planned {a:,} B, read {b:,} B")
    return errors
