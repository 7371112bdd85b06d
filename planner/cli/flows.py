"""The one function a command calls where it composes layers: search, then measure, then write
(``suggest``); read, re-estimate, write (``emit``); the traced or measured probe (``probe``); a
study with the chosen probe, then write and plot (``tune``). Each takes one request and returns one
result for one renderer; ``say`` reports progress (the files written) on stderr.

Probes are imported inside the functions that use them (DESIGN.md: the command line imports probes
only in the commands that need them); everything else is the engine's, emit's and render's.
"""

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ConfigDict, Field

from planner.core.errors import PlannerInputError
from planner.core.record import Record
from planner.engine.suggest import suggest as search_plans
from planner.schema.suggest import SuggestRequest, SuggestResult

if TYPE_CHECKING:  # the tune flow's models, imported when it runs (planner suggest does not need them)
    from planner.schema.tune import TuneRequest, TuneResult

Say = Callable[[str], None]


class SuggestJob(SuggestRequest):
    """``planner suggest``: the search, and what to do with its winner."""

    out: Path | None = None  # write the winner's launch files here
    force: bool = False
    probe: int = Field(0, ge=0, le=1000)  # measure the top K plans on this machine's GPU
    probe_timeout: float = Field(900.0, gt=0)


def suggest(job: SuggestJob, say: Say):
    """Search; with ``probe``, measure the top plans and take the fastest measured one; with
    ``out``, write the winner's files. Returns the SuggestResult (or, probed, the ProbedSuggestion)."""
    device = None
    if job.probe:
        from planner.probes.measured_command import require_gpu

        device = require_gpu()  # before the search: no GPU, no wait
    result = search_plans(job)
    served: Any = result  # the suggestion, or its probed form
    winner = 1
    if device is not None and result.fits:
        from planner.probes.measured_command import probe_suggestion

        probed = probe_suggestion(result, job.probe, device, job.probe_timeout, store=job.calibration)
        served, winner = probed, probed.best_rank or 1
    if job.out is not None and result.fits:
        from planner.emit import emit as write_plan

        report(write_plan(result, job.out, job.force, rank=winner, calibration=job.calibration), say)
    return served


class EmitJob(Record):
    """``planner emit``: a plan file in, its launch files out."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    plan: Path  # planner suggest --json output, an emitted plan.json, or planner estimate --json output
    out: Path
    rank: int = 1
    gpus: str | None = None  # the plan's GPUs, overridden
    force: bool = False
    calibration: Path | None = None


class Emitted(Record):
    model_config = ConfigDict(extra="forbid", frozen=True)

    written: list[str]
    kept: list[str] = []  # the user's files at planner file names, left as they were
    fits: bool  # the plan fits (the files are written either way; PLAN.md says when it does not)


def emit(job: EmitJob, say: Say) -> Emitted:
    from planner.emit import build_files, load_plan_file, write_files

    search = load_plan_file(job.plan)
    written = write_files(build_files(search, job.rank, job.gpus, job.calibration), job.out, job.force)
    report(written, say)
    return Emitted(written=[str(p) for p in written.paths], kept=written.kept, fits=search.plans[job.rank - 1].fits)


def report(written, say: Say) -> None:
    """The files a write put in place, and the user's files it kept (planner/emit/writer.py)."""
    for path in written.paths:
        say(f"wrote {path}")
    for kept in written.kept:
        say(f"kept {kept}")


def probe(fields: dict, plan: Path | None, rank: int):
    """``planner probe``: the plan from its flags (``fields``) or from a plan file, traced on this
    CPU or measured on this GPU (``fields["fidelity"]``)."""
    from planner.probes.command import ProbeRequest, run_probe

    if plan is not None:
        from planner.probes.measured_command import plan_fields

        fields = fields | plan_fields(plan, rank)
    elif fields.get("model") is None or fields.get("gpus") is None:
        raise PlannerInputError("give the plan: --model and --gpus (and config flags), or --plan FILE")
    request = ProbeRequest(**fields)
    if request.fidelity == "measured":
        from planner.probes.measured_command import run_measured_probe

        return run_measured_probe(request)
    return run_probe(request)


def tune(request: "TuneRequest", force: bool, console) -> "TuneResult":
    """``planner tune``: refuse an --out holding files at planner's names that are not planner's own
    (before any probe is spent; a rerun resumes the study and rewrites the plan it wrote), choose
    the probe for the fidelity, run the study with a live progress line, write the best plan's
    files and the plot."""
    from planner.emit.files import foreign_plan_files
    from planner.engine.tune import tune as run_study
    from planner.probes.tune_probes import choose
    from planner.render.tune import Progress, plot

    if request.out is not None and not force:  # (planner's own files: a resumed study rewrites its plan)
        foreign = foreign_plan_files(request.out)
        if foreign:
            raise PlannerInputError(f"{request.out} already has {', '.join(foreign)}, not written by planner or "
                                    "changed since", hint="Pass --force to replace planner's files there, or choose "
                                                          "another --out.")
    chosen, probe_plan, notes = choose(request.fidelity, request.probe_timeout, request.calibration)
    with Progress(request.probes, chosen, console) as progress:
        result = run_study(request, probe_plan, chosen, progress.update, notes)
    if request.out is not None and result.best_plan is not None:
        from planner.emit import emit as write_plan
        from planner.emit import single_plan_result

        picture = plot(result)
        report(write_plan(single_plan_result(result.best_plan), request.out, force, calibration=request.calibration,
                          extra={"tune.png": picture} if picture else None, replace_own=True),
               lambda line: console.print(line, highlight=False))
        if not picture:
            console.print("no tune.png: pip install matplotlib for the plot", highlight=False)
    return result


def depths(text: str | None) -> list[int]:
    """``--extrapolate-from 2,4`` -> [2, 4] (or three depths)."""
    if not text:
        return []
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise PlannerInputError(f"--extrapolate-from {text!r}: two or three depths, e.g. 2,4") from None
    if len(values) not in (2, 3) or min(values) < 1:
        raise PlannerInputError(f"--extrapolate-from {text!r}: two or three depths of at least one layer, e.g. 2,4")
    return values


__all__ = ["EmitJob", "Emitted", "SuggestJob", "SuggestResult", "depths", "emit", "probe", "suggest", "tune"]
