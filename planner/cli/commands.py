"""The command line: thin. Each command builds one request from its options, calls one function,
renders one result, and exits with the code the result (or a typed error) says.

The technique options of every planning command come from the strategy registry
(planner/cli/options.py ``with_techniques``); the shared options are typed aliases there.
Exit codes: 0 fits, 1 does not fit or infeasible, 2 bad input, 3 a probe failed (planner/core/errors.py).
"""

import copy
import json
import sys
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.markup import escape

from planner.cli import options
from planner.cli.options import with_space, with_target, with_techniques
from planner.cli.version import version
from planner.core.distribution import install_line
from planner.core.errors import EXIT_DOES_NOT_FIT, EXIT_FITS, EXIT_PROBE_FAILED, PlannerError, PlannerInputError
from planner.core.launch_contract import Launcher
from planner.core.numerics import NumericsPolicy
from planner.cost.overheads import DEFAULT_MARGIN
from planner.render.console import SafeConsole

# What a screen's next command leaves out: the defaults of suggest's search-space options.
SPACE_DEFAULTS = {"launcher": Launcher.PLANNER, "numerics": NumericsPolicy.LADDER}
EXIT_CODES = "Exit codes: 0 fits, 1 does not fit or infeasible, 2 bad input."
#: The longest a timeout flag may ask for (a week): an infinite or huge one would overflow the
#: child-process wait.
MAX_SECONDS = 7 * 86400


def _seconds(value: float | None) -> float | None:
    """A timeout flag's check (a callback, so --help shows SECONDS, not a range)."""
    if value is not None and not 0 < value <= MAX_SECONDS:
        raise typer.BadParameter(f"{value:g}: give seconds above 0, at most {MAX_SECONDS:,} (a week)")
    return value

app = typer.Typer(
    help=f"planner: the fastest LLM training configuration that fits your GPUs. {EXIT_CODES}",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = SafeConsole(stderr=True)


def _say(text: str) -> None:
    err.print(text, highlight=False)


def _print_version(value: bool) -> None:
    if value:
        sys.stdout.write(f"planner {version()}\n")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                          help="print planner's version and exit")] = False,
) -> None:
    pass


def _working(text: str):
    """A live line on stderr while a slow step runs, only when stderr is a terminal (never in a
    pipe or a log, never on stdout)."""
    return err.status(text) if err.is_terminal else nullcontext()


def _words(values: dict, defaults: dict | None = None) -> list[str]:
    """Options back into command-line words, for the next command a screen shows: None, False,
    empty lists and ``defaults`` left out; a list is a repeated option."""
    out: list[str] = []
    for name, value in values.items():
        if value is None or value is False or value == [] or (defaults or {}).get(name, object()) == value:
            continue
        for v in value if isinstance(value, list) else [value]:
            flag = "--" + name.replace("_", "-")
            out += [flag] if v is True else [flag, str(getattr(v, "value", v))]
    return out


def _asked(target: dict, options: list[str], **paths):
    """How the user asked, for the screen's next commands (calibration left to the environment)."""
    from planner.render.next_steps import Asked

    rest = {k: v for k, v in target.items() if k not in ("model", "gpus", "calibration")}
    return Asked(model=target["model"], gpus=target["gpus"], target=tuple(_words(rest, {"margin": DEFAULT_MARGIN})),
                 options=tuple(options), **paths)


def _validation_problems(e: ValidationError) -> list[str]:
    return [f"--{'-'.join(map(str, er['loc'])).replace('_', '-')}: {er['msg']}" for er in e.errors()]


def _fits_exit(result: Any) -> int:
    return EXIT_FITS if result.fits else EXIT_DOES_NOT_FIT


def serve(plan: Callable[[], Any], render: str | Callable, as_json: bool,
          exit_code: Callable[[Any], int] = _fits_exit) -> None:
    """Run one planning function; print its result as JSON or with a renderer (a name in
    planner.render.report, or a function); exit with ``exit_code(result)`` (default: 0 when it fits,
    1 when not). A PlannerError (bad input: 2; a probe's failure: 3) is a message and its exit code,
    never a traceback; so is a request that fails validation (2)."""
    try:
        result = plan()
    except ValidationError as e:
        error: PlannerError | None = PlannerInputError(_validation_problems(e))
    except PlannerError as e:
        error = e
    except OSError as e:  # a path the file system refuses (too long, not permitted, ...) that no reader named
        name = str(e.filename or "")
        error = PlannerInputError(f"{e.strerror or e}: {name[:120] + ('...' if len(name) > 120 else '')}",
                                  hint="Check the paths given to the flags.")
    else:
        error = None
    if error is not None:
        err.print(f"[bold red]{error.label}:[/] {escape(error.message)}", highlight=False)
        raise typer.Exit(error.exit_code)
    if as_json:
        sys.stdout.write(json.dumps(result.model_dump(mode="json"), indent=2) + "\n")
    else:
        from planner.render import report

        renderer = getattr(report, render) if isinstance(render, str) else render
        renderer(result, report.console_for_stdout())
    raise typer.Exit(exit_code(result))


@app.command(help=f"Estimate per-GPU memory of one configuration and say whether it fits. {EXIT_CODES}")
@with_techniques("one")
@with_target
def estimate(
    target: dict,
    techniques: dict,
    micro_batch_size: options.MicroBatch = 1,
    grad_accum: options.GradAccum = 1,
    seq_len: options.SeqLen = None,
    batching: options.BatchingOption = None,
    lengths: options.LengthsFile = None,
    as_json: options.Json = False,
) -> None:
    from planner.engine.estimate import estimate as run
    from planner.render.report import render_estimate
    from planner.schema.estimate import EstimateRequest

    workload = {"micro_batch_size": micro_batch_size, "grad_accum": grad_accum, "seq_len": seq_len,
                "batching": batching, "lengths": lengths}
    asked = _asked(target, _words(techniques) + _words(workload, {"micro_batch_size": 1, "grad_accum": 1}))
    serve(lambda: run(EstimateRequest(**target, **techniques, **workload)), partial(render_estimate, asked=asked),
          as_json)


@app.command(help="Search every configuration and print the fastest plans that fit. "
                  "Exit codes: 0 a plan fits, 1 nothing fits, 2 bad input.")
@with_techniques("many")
@with_target
@with_space
def suggest(
    target: dict,
    techniques: dict,
    space: dict,
    top: Annotated[int, typer.Option(metavar="N", help="how many plans to show")] = 5,
    engine: Annotated[str, typer.Option(metavar="NAME", help="auto | exhaustive | tpe | nsga2 "
                                             "(auto: exhaustive up to 200,000 candidates)")] = "auto",
    out: Annotated[Path | None, typer.Option(help="write the winner's launch files here "
                                                  "(accelerate, DeepSpeed, Trainer, launch.sh, PLAN.md)")] = None,
    force: options.Force = False,
    trials: Annotated[int, typer.Option(metavar="N", help="Optuna trials (tpe / nsga2 engines)")] = 400,
    seed: options.Seed = 0,
    probe: Annotated[int, typer.Option(metavar="K", help="measure the top K plans on this GPU (short real runs); the "
                                                         "fastest measured is what --out writes")] = 0,
    probe_timeout: Annotated[float, typer.Option(help="seconds per measured probe", callback=_seconds,
                                                 metavar="SECONDS")] = 900.0,
    tokens: Annotated[float | None, typer.Option(
        metavar="N", help="tokens to train on (e.g. 2e9): the winner's training time")] = None,
    price_per_gpu_hour: Annotated[float | None, typer.Option(metavar="USD", help="price of one GPU-hour, "
                                                                  "for the training cost (with --tokens)")] = None,
    as_json: options.Json = False,
) -> None:
    from planner.cli import flows

    def run():
        job = flows.SuggestJob(
            **target, **techniques,
            **space, top=top, engine=engine, tokens=tokens, price_per_gpu_hour=price_per_gpu_hour,
            trials=trials, seed=seed, out=out, force=force, probe=probe, probe_timeout=probe_timeout)
        with _working(f"searching plans for {target['model']} on {target['gpus']}"
                      + (f", then probing the top {probe}" if probe else "") + " ..."):
            return flows.suggest(job, _say)

    render: Callable[..., None]
    if probe:
        from planner.render.probe import render_probed as render
    else:
        from planner.render.report import render_suggest as render

    asked = _asked(target, _words(techniques) + _words(space, SPACE_DEFAULTS)
                   + _words({"engine": engine, "trials": trials, "seed": seed, "probe": probe},
                            {"engine": "auto", "trials": 400, "seed": 0, "probe": 0}), out=out)
    serve(run, partial(render, asked=asked), as_json)


@app.command(help="Write a plan's launch files: accelerate_config.yaml, deepspeed_config.json (ZeRO), "
             "training_args.json, launch.sh, plan.json, PLAN.md. Exit codes: 0 written, 1 the plan does not fit "
             "(files still written, PLAN.md says so), 2 bad input.")
def emit(
    plan: Annotated[Path, typer.Option(help="planner suggest --json output, an emitted plan.json, "
                                            "or planner estimate --json output")],
    out: Annotated[Path, typer.Option(help="directory to write into")],
    rank: Annotated[int, typer.Option(help="which plan of a suggest result (1 = best)")] = 1,
    gpus: Annotated[str | None, typer.Option(help="override the plan's GPUs (needed for a custom GPU YAML)")] = None,
    force: options.Force = False,
    calibration: options.Calibration = None,
) -> None:
    from planner.cli import flows

    serve(lambda: flows.emit(flows.EmitJob(plan=plan, out=out, rank=rank, gpus=gpus, force=force,
                                           calibration=options.calibration_store(calibration)), _say),
          lambda result, console: None, as_json=False)


@app.command(help="Will this job fit? Reads the job's own files (accelerate YAML, DeepSpeed JSON, Trainer "
             "arguments JSON/YAML, a planner launch's runtime.json, any subset, a torchtitan TOML, or --job-dir); "
             "flags fill gaps or override. Exit codes: 0 fits, "
             "1 will not fit, 2 bad input (unreadable file, unknown key, contradiction) or a job planner does not "
             "plan (preference or RL training: DPO, KTO, ORPO, GRPO, PPO, reward models).")
@with_techniques("optional")
@partial(with_target, model_from_files=True)
def check(
    target: dict,
    techniques: dict,
    accelerate_config: Annotated[Path | None, typer.Option(help="the job's accelerate config YAML")] = None,
    deepspeed_config: Annotated[Path | None, typer.Option(help="the job's DeepSpeed JSON")] = None,
    training_args: Annotated[Path | None, typer.Option(help="the job's Trainer arguments (JSON or YAML)")] = None,
    runtime_args: Annotated[Path | None, typer.Option(help="the runtime.json of a planner launch")] = None,
    torchtitan_config: Annotated[Path | None, typer.Option(help="a torchtitan job's TOML (--job.config_file)")] = None,
    job_dir: Annotated[Path | None, typer.Option(help="a directory holding those files, e.g. from suggest --out")] = None,
    micro_batch_size: Annotated[int | None, typer.Option("--micro-batch-size", "--mbs", help="sequences per GPU per micro-batch "
                                                                                             "(from the files)")] = None,
    grad_accum: Annotated[int | None, typer.Option(help="gradient accumulation steps (from the files)")] = None,
    seq_len: Annotated[int | None, typer.Option(help="tokens per sequence (files rarely say; default 2048)")] = None,
    batching: options.BatchingOption = None,
    lengths: options.LengthsFile = None,
    as_json: options.Json = False,
) -> None:
    from planner.check import CheckRequest
    from planner.check import check as run
    from planner.render.report import render_check

    def plan():
        with _working("checking the job and searching for alternatives ..."):
            return run(CheckRequest(
                **target, **techniques,
                accelerate_config=accelerate_config, deepspeed_config=deepspeed_config, training_args=training_args,
                runtime_args=runtime_args, torchtitan_config=torchtitan_config, job_dir=job_dir,
                micro_batch_size=micro_batch_size, grad_accum=grad_accum,
                seq_len=seq_len, batching=batching, lengths=lengths))

    serve(plan, partial(render_check, asked=_asked(target, [], job_dir=job_dir)), as_json)


def _listing(entries: list, render: Callable, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps([e.model_dump(mode="json") for e in entries], indent=2) + "\n")
    else:
        from planner.render.report import console_for_stdout

        render(entries, console_for_stdout())


@app.command(help="List the model catalog (ids usable with --model): id, family, parameters.")
def models(as_json: options.Json = False) -> None:
    from planner.render.catalogs import model_entries, render_models

    _listing(model_entries(), render_models, as_json)


@app.command(help="List the GPU catalog (names usable with --gpus): id, memory, dense bf16 and fp8 TFLOP/s, link, "
                  "aliases.")
def gpus(as_json: options.Json = False) -> None:
    from planner.render.catalogs import gpu_entries, render_gpus

    _listing(gpu_entries(), render_gpus, as_json)


PROBE_EXIT_CODES = ("Exit codes: 0 the probe agrees with the analytic model, 1 it differs (measured: or ran out of "
                    "memory where a fit was predicted), 2 bad input or no GPU for --fidelity measured, 3 the probe "
                    "failed (crash, timeout).")


@app.command(help="Probe a plan and compare it with the cost model. --fidelity traced: the real model on fake "
                  "tensors (CPU, no GPU), every memory term. --fidelity measured: a short real run on this "
                  "machine's GPU in a child process (peaks, OOM, step time), kept in the calibration store. "
                  f"Give the plan as flags or as --plan FILE. Needs the probes extra "
                  f"({escape(install_line(['probes']))}). {PROBE_EXIT_CODES}")
@with_techniques("one")
def probe(
    techniques: dict,
    model: Annotated[str | None, typer.Option(help="HF id from the catalog or local HF cache, "
                                                   "or a config.json / model folder")] = None,
    gpus: Annotated[str | None, typer.Option(help="the plan's GPUs; their count is FSDP's world size, e.g. 8xH100-80")] = None,
    plan: Annotated[Path | None, typer.Option(help="probe a planned config: planner suggest --json output, an emitted plan.json, "
                                                   "or planner estimate --json output "
                                                   "(instead of --model, --gpus and the config flags)")] = None,
    rank: Annotated[int, typer.Option(help="with --plan: which plan of a suggest result (1 = best)")] = 1,
    fidelity: Annotated[str, typer.Option(help="traced: FakeTensorMode + MemTracker on this machine's CPU; measured: a real run "
                                               "on this machine's GPU")] = "traced",
    micro_batch_size: options.MicroBatch = 1,
    grad_accum: Annotated[int, typer.Option(help="gradient accumulation steps (measured only)")] = 1,
    seq_len: options.SeqLen = None,
    layers: Annotated[int | None, typer.Option(help="probe a reduced depth (default: the full model)")] = None,
    extrapolate_from: Annotated[str | None, typer.Option(help="measured: two reduced depths, e.g. 2,4, the full depth "
                                                              "extrapolated from them (big models on one GPU); a third, e.g. "
                                                              "2,4,8, checks that memory is linear in depth")] = None,
    steps: Annotated[int, typer.Option(help="measured: timed optimizer steps")] = 5,
    warmup_steps: Annotated[int, typer.Option(help="measured: untimed steps first")] = 2,
    timeout: Annotated[float, typer.Option(help="seconds before a probe's child process is stopped",
                                           callback=_seconds, metavar="SECONDS")] = 1800.0,
    explain: Annotated[bool, typer.Option("--explain", help="traced: list the tensors alive at the traced peak")] = False,
    calibration: options.Calibration = None,
    as_json: options.Json = False,
) -> None:
    from planner.cli import flows
    from planner.probes.command import EXIT_AGREE, EXIT_DISAGREE
    from planner.render.probe import render_measured, render_probe

    def run():
        fields = dict(model=model, gpus=gpus, **techniques, micro_batch_size=micro_batch_size, grad_accum=grad_accum,
                      seq_len=seq_len, fidelity=fidelity, layers=layers, timeout=timeout, explain=explain,
                      extrapolate_from=flows.depths(extrapolate_from), steps=steps, warmup_steps=warmup_steps,
                      calibration=options.calibration_store(calibration))
        return flows.probe(fields, plan, rank)

    def exit_code(result) -> int:
        if getattr(result, "status", "ok") in ("error", "timeout", "refused"):
            return EXIT_PROBE_FAILED
        return EXIT_AGREE if result.agrees else EXIT_DISAGREE

    serve(run, render_measured if fidelity == "measured" else render_probe, as_json, exit_code)


@app.command(help="Find the fastest plan by measurement: an Optuna study over suggest's search space that spends "
                  "--trials probes (measured on this machine's GPU; without one, traced memory and analytic time), "
                  "skips what the analytic model rejects, resumes where it stopped, and can be shared by workers "
                  "(--storage). Exit codes: 0 a probed plan fits (the best is shown and written), 1 none does, "
                  "2 bad input.")
@with_techniques("many")
@with_target
@with_space
def tune(
    target: dict,
    techniques: dict,
    space: dict,
    trials: Annotated[int, typer.Option(
        metavar="N", help="probes to spend, over the whole study (a resumed tune continues the count; 0 "
                          "reports an existing study's best and writes its files, probing nothing)")] = 20,
    timeout: Annotated[float | None, typer.Option(help="seconds for this run (the study resumes later)",
                                                  callback=_seconds, metavar="SECONDS")] = None,
    fidelity: Annotated[str, typer.Option(help="auto (measured with a GPU, else traced) "
                                               "| measured | traced | analytic")] = "auto",
    band: Annotated[float, typer.Option(help="the model's relative error on throughput: stop when no unprobed candidate can beat "
                                             "the best probed one by more")] = 0.15,
    storage: Annotated[str | None, typer.Option(help="an Optuna database URL shared by workers, sqlite:/// or "
                                                     "postgresql:// (default: sqlite:///OUT/study.db, "
                                                     "or ./planner-tune.db)")] = None,
    study_name: Annotated[str | None, typer.Option(help="default: from the model, GPUs, fidelity and search space")] = None,
    out: Annotated[Path | None, typer.Option(help="write the best plan's launch files, tune.png and the study file here")] = None,
    force: options.Force = False,
    enqueue: Annotated[int, typer.Option(help="the analytic model's top candidates probed first")] = 5,
    probe_timeout: Annotated[float, typer.Option(help="seconds per probe", callback=_seconds, metavar="SECONDS")] = 900.0,
    heartbeat_seconds: Annotated[int, typer.Option(help="a dead worker's trial is retried after twice this")] = 30,
    seed: options.Seed = 0,
    as_json: options.Json = False,
) -> None:
    from planner.cli import flows
    from planner.render.tune import render_tune
    from planner.schema.tune import TuneRequest

    serve(lambda: flows.tune(TuneRequest(
        **target, **techniques,
        **space, seed=seed, fidelity=fidelity,
        band=band, probes=trials, timeout=timeout, probe_timeout=probe_timeout, storage=storage,
        study_name=study_name, out=out, enqueue=enqueue, heartbeat_seconds=heartbeat_seconds,
    ), force, err), render_tune, as_json)


@app.command(help="Fit the analytic model to measured probes (planner probe --fidelity measured): per GPU the CUDA "
                  "context, the allocator's fragmentation reserve and achieved FLOP/s per compute dtype. Saves them "
                  "in the calibration store, where estimate, suggest and check use them. Exit codes: 0 fitted, "
                  "1 nothing to fit (no measurement with status ok), 2 bad input (no store, no measurements).")
def calibrate(
    store: Annotated[str | None, typer.Option(
        envvar="PLANNER_CALIBRATION", show_envvar=True,
        help="the calibration store (default: ~/.cache/planner/calibration.sqlite; 'off': none)")] = None,
    gpu: Annotated[str | None, typer.Option(help="fit only the measurements taken on this GPU (catalog id or alias)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="fit and print; save nothing")] = False,
    as_json: options.Json = False,
) -> None:
    from planner.catalog.calibration import store_path
    from planner.engine.calibrate import EXIT_FITTED, EXIT_NOTHING_TO_FIT
    from planner.engine.calibrate import calibrate as run
    from planner.schema.calibrate import CalibrateRequest

    serve(lambda: run(CalibrateRequest(store=options.calibration_store(store), gpu=gpu, dry_run=dry_run,
                                       default_store=store_path())),
          "render_calibrate", as_json, lambda result: EXIT_FITTED if result.fitted else EXIT_NOTHING_TO_FIT)


def main() -> None:
    """Run the command line. Typer builds the click parameters of every command before it runs
    one (~12-24 ms of the 0.5 s a planning command may take, docs/architecture.md); when the first
    word names a command, only that command is built. Anything else (no command, --help, a word
    that is no command) goes to the whole app, whose messages list every command."""
    asked = sys.argv[1] if len(sys.argv) > 1 else ""
    named = [c for c in app.registered_commands
             if (c.name or (c.callback.__name__ if c.callback else "")).replace("_", "-") == asked]
    if named:
        one = copy.copy(app)
        one.registered_commands = named
        one()
    else:
        app()
