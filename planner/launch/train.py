"""The planner launch's main: read the plan's files, load the user's model and data, train with the
Hugging Face Trainer, compare the live run with the plan (planner/launch/__init__.py)."""

import argparse
import json
import os
import sys
from pathlib import Path

from pydantic import ValidationError

from planner.check.job_files import JOB_FILES, read_job
from planner.core.distribution import DIST, install_line
from planner.core.errors import PlannerInputError
from planner.core.terminal import printable
from planner.strategies import BY_FIELD, TrainingConfig

TRAINING_ARGS = JOB_FILES["training_args"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m planner.launch",
        description="Train a model as a planner plan says (run by the plan's launch.sh under accelerate launch). "
                    "Exit codes: 0 trained as planned, 1 the live run differs from the plan, 2 bad input (a "
                    "package the plan needs that is missing too: the message names it and the pip install line).")
    p.add_argument("--job-dir", type=Path, default=Path(os.environ.get("PLANNER_JOB_DIR", ".")),
                   help="the plan folder (planner suggest --out); default: $PLANNER_JOB_DIR, set by launch.sh")
    p.add_argument("--model", required=True, help="a local model folder, or a Hugging Face id in the local cache")
    p.add_argument("--data", required=True,
                   help="a JSONL file (text, TRL's messages or prompt/completion; GRPO: prompt; DPO: prompt/chosen/"
                        "rejected), a .txt file, a datasets save_to_disk folder, or 'sample' (a smoke test)")
    p.add_argument("--text-field", default="text", help="the JSONL field / dataset column holding the text")
    p.add_argument("--output-dir", type=Path, help="where checkpoints and the model go (default: the plan's outputs/)")
    p.add_argument("--max-steps", type=int, help="optimizer steps (default: one epoch of the data)")
    p.add_argument("--epochs", type=float, help="epochs over the data when --max-steps is not given")
    p.add_argument("--learning-rate", type=float, help="peak learning rate (default: the Trainer's)")
    p.add_argument("--seed", type=int, help="random seed (default: the Trainer's)")
    p.add_argument("--no-save", action="store_true", help="do not save the trained model at the end")
    p.add_argument("--reward", help="GRPO plans: the reward function, module:function (importable from the working "
                                    "directory; TRL's reward function signature); with --data sample a smoke-test "
                                    "reward when not given")
    return p.parse_args(argv)


def plan_config(job_dir: Path) -> TrainingConfig:
    """The configuration the launch files mean, read by planner check's reader: every technique
    and the workload (a field no file states takes the library default: TrainingConfig's)."""
    paths = {key: job_dir / name for key, name in JOB_FILES.items() if (job_dir / name).is_file()}
    if "training_args" not in paths:
        raise PlannerInputError(f"{job_dir}: no {TRAINING_ARGS}", hint="Pass --job-dir, the folder planner suggest --out wrote.")
    reading = read_job(paths)
    values = {}
    for name, (value, _) in reading.values.items():
        strategy = BY_FIELD.get(name)
        values[name] = strategy.settle(value, None)[0] if strategy and strategy.settle else value
    try:
        return TrainingConfig(**values)
    except ValidationError as e:
        raise PlannerInputError([f"{job_dir}: {'.'.join(map(str, er['loc']))}: {er['msg']}" for er in e.errors()],
                                hint="Fix the plan's files, or write them again with planner emit.") from None


def main(argv: list[str] | None = None) -> None:
    try:
        code = run(parse_args(argv))
    except PlannerInputError as e:  # (paths and values the user gave, shown as text: core/terminal.py)
        print(printable("planner.launch: " + "\n  ".join(e.problems)), file=sys.stderr)
        if e.hint:
            print(printable(e.hint), file=sys.stderr)
        code = 2
    except ImportError as e:
        module = _missing_module(e)
        if module is None:  # planner's own code or the standard library: a bug, with its traceback
            raise
        print(_missing_module_message(module, e), file=sys.stderr)
        code = 2  # bad input: the environment lacks what the plan needs (1 says the live run differs)
    sys.exit(code)


#: planner's own top-level package (pyproject.toml's packages): an import of it failing is a bug.
OWN_PACKAGES = ("planner",)


def _missing_module(e: BaseException | None) -> str | None:
    """The top-level third-party module whose import failed: ``e.name``, or that of the import
    error ``e`` was raised from (planner.runtime re-raises some with install advice, ``from None``)."""
    while e is not None:
        if isinstance(e, ImportError) and e.name:
            top = e.name.partition(".")[0]
            return None if top in OWN_PACKAGES or top in sys.stdlib_module_names else top
        e = e.__cause__ or e.__context__
    return None


def _missing_module_message(module: str, error: ImportError) -> str:
    """One paragraph: the module, and the pip install line of planner's extra that provides it."""
    from packaging.utils import canonicalize_name

    dist = canonicalize_name(module)  # (the packages of planner's extras are named as they import: liger_kernel)
    extra = _smallest_extra_installing(dist)
    missing = isinstance(error, ModuleNotFoundError)
    pip = "pip install" if missing else "pip install -U"
    install = (f"{install_line([extra], upgrade=not missing)} (planner's {extra} extra; PLAN.md's \"How to run\" "
               "names every extra this plan needs)") if extra else f"{pip} {dist}"
    state = "is not installed" if missing else f"does not import ({error})"
    return (f"planner.launch: the plan needs the Python package {module}, which {state}. "
            f"Install it with {install}, then launch again.")


def _smallest_extra_installing(dist: str) -> str | None:
    """The pip extra of planner with the fewest packages that installs ``dist``: pyproject.toml's
    optional-dependencies, read from the installed planner's metadata (None without it)."""
    from importlib.metadata import PackageNotFoundError, metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    try:
        meta = metadata(DIST)
    except PackageNotFoundError:
        return None
    requirements = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]

    def installs(extra: str) -> set[str]:
        return {canonicalize_name(r.name) for r in requirements if r.marker and r.marker.evaluate({"extra": extra})}

    return min((x for x in meta.get_all("Provides-Extra") or [] if dist in installs(x)),
               key=lambda x: len(installs(x)), default=None)


def run(args: argparse.Namespace) -> int:
    config = plan_config(args.job_dir)
    from planner.launch.session import Session

    session = Session(args, config)
    trainer = session.trainer()
    trainer.train()
    from planner.launch.live import differences, observe

    live = observe(trainer, session)
    wrong = differences(config, live)
    rank = trainer.args.process_index
    out = Path(trainer.args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"planner-live-rank{rank}.json").write_text(json.dumps(
        {"plan": config.model_dump(mode="json"), "live": live, "differences": wrong}, indent=2, default=str) + "\n")
    verdict = "the live run is the plan" if not wrong else "the live run DIFFERS from the plan: " + "; ".join(wrong)
    print(f"planner.launch: rank {rank}/{trainer.args.world_size}: {verdict}", flush=True)
    if not args.no_save:
        trainer.save_model()
    _shut_down_process_group()
    return 1 if wrong else 0


def _shut_down_process_group() -> None:
    """Destroy the process group before the interpreter exits. Left to exit, a rank's collective
    threads (gloo's, DeepSpeed's) can be torn down while joinable and abort the process
    ("terminate called without an active exception", exit -6) after a run that trained as
    planned: seen once in CI on the ZeRO-2 optimizer-offload launch."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
