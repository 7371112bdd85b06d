"""The command line: thin. Options become one request model; one function plans; exit codes.

Exit codes: 0 fits, 1 does not fit or infeasible, 2 bad input.
"""

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from planner.core.errors import EXIT_DOES_NOT_FIT, EXIT_FITS, EXIT_PROBE_FAILED, PlannerInputError
from planner.core.vocabulary import Attention, Checkpointing, Loss, Offload, Optimizer, Precision, Sharding

EXIT_CODES = "Exit codes: 0 fits, 1 does not fit or infeasible, 2 bad input."
app = typer.Typer(
    help=f"planner: the fastest LLM training configuration that fits your GPUs. {EXIT_CODES}",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)

# Options suggest and tune share (the search space and the plan target).
ModelOpt = Annotated[str, typer.Option("--model", help="HF id from the catalog or local HF cache, or a config.json / model folder")]
GpusOpt = Annotated[str, typer.Option("--gpus", help="[NODES x] [GPUS x] GPU, e.g. 1xA100-40, 8xH100-80, 4x8xH100-80")]
OptimizersOpt = Annotated[list[Optimizer] | None, typer.Option("--optimizer", help="allow only these (repeat the flag); default: adamw and its 8-bit, paged and Adam-mini forms")]
PrecisionsOpt = Annotated[list[Precision] | None, typer.Option("--precision", help="allow only these (repeatable)")]
CheckpointingsOpt = Annotated[list[Checkpointing] | None, typer.Option("--checkpointing", help="allow only these (repeatable)")]
ShardingsOpt = Annotated[list[Sharding] | None, typer.Option("--sharding", help="allow only these (repeatable)")]
OffloadsOpt = Annotated[list[Offload] | None, typer.Option("--offload", help="allow only these (repeatable)")]
LossesOpt = Annotated[list[Loss] | None, typer.Option("--loss", help="allow only these (repeatable)")]
AttentionsOpt = Annotated[list[Attention] | None, typer.Option("--attention", help="allow only these (repeatable)")]
MicroBatchesOpt = Annotated[list[int] | None, typer.Option("--micro-batch-size", "--mbs", help="allow only these (repeatable); default: every divisor of the per-GPU share of the global batch")]
SeqLenOpt = Annotated[int | None, typer.Option("--seq-len", help="tokens per sequence (default: 2048, or the model's position limit if shorter)")]
GlobalBatchOpt = Annotated[int | None, typer.Option("--global-batch-size", help="sequences per optimizer step over all GPUs (default: the smallest GPUs x 2^k >= 64)")]
ExactOptimizerOpt = Annotated[bool, typer.Option("--exact-optimizer", help="exclude quantized (8-bit) optimizer states")]
MarginOpt = Annotated[float, typer.Option("--margin", help="fraction of GPU memory to keep free, e.g. 0.05")]
HostMemoryOpt = Annotated[float | None, typer.Option("--host-memory-gb", help="host RAM per node, GB (default: 2x the node's GPU memory, >= 64)")]
InterNodeOpt = Annotated[float | None, typer.Option("--inter-node-gbps", help="network bandwidth per node, Gbit/s (default: 200 per GPU)")]
SPACE_LISTS = ("optimizer", "precision", "checkpointing", "sharding", "offload", "loss", "attention", "micro_batch_size")
SPACE_VALUES = ("model", "gpus", "seq_len", "global_batch_size", "exact_optimizer", "margin", "host_memory_gb",
                "inter_node_gbps")


def _space_fields(options: dict) -> dict:
    """The shared flags among a command's ``locals()``, as request fields: an unset list leaves
    that choice to the search."""
    return {k: options[k] or [] for k in SPACE_LISTS} | {k: options[k] for k in SPACE_VALUES}



def _fail(e: PlannerInputError) -> None:
    err.print(f"[bold red]error:[/] {escape(e.message)}", highlight=False)
    raise typer.Exit(e.exit_code)


def _validation_problems(e: ValidationError) -> list[str]:
    return [f"--{'-'.join(map(str, er['loc'])).replace('_', '-')}: {er['msg']}" for er in e.errors()]


def _fits_exit(result: Any) -> int:
    return EXIT_FITS if result.fits else EXIT_DOES_NOT_FIT


def _serve(plan: Callable[[], Any], renderer: str | Callable, as_json: bool,
           exit_code: Callable[[Any], int] = _fits_exit, probe: bool = False) -> None:
    """Run one planning function; print its result as JSON or with ``planner.render.report.<renderer>``
    (or the renderer function given); exit with ``exit_code(result)`` (default: 0 when it fits,
    1 when not), 2 on bad input (a message, never a traceback), and, for a probe, 3 when the probe
    itself failed (RuntimeError)."""
    try:
        result = plan()
    except ValidationError as e:
        _fail(PlannerInputError(_validation_problems(e)))
    except PlannerInputError as e:
        _fail(e)
    except RuntimeError as e:
        if not probe:
            raise
        err.print(f"[bold red]probe failed:[/] {str(e)[-1500:]}", highlight=False)
        raise typer.Exit(EXIT_PROBE_FAILED) from None
    if as_json:
        sys.stdout.write(json.dumps(result.model_dump(mode="json"), indent=2) + "\n")
    else:
        from planner.render import report

        render = getattr(report, renderer) if isinstance(renderer, str) else renderer
        render(result, report.console_for_stdout())
    raise typer.Exit(exit_code(result))


@app.command(help=f"Estimate per-GPU memory of one configuration and say whether it fits. {EXIT_CODES}")
def estimate(
    model: Annotated[str, typer.Option(help="HF id from the catalog or local HF cache, or a config.json / model folder")],
    gpus: Annotated[str, typer.Option(help="[NODES x] [GPUS x] GPU, e.g. 1xA100-40, 8xH100-80, 4x8xH100-80, 2x./gpu.yaml")],
    optimizer: Optimizer = Optimizer.ADAMW,
    precision: Precision = Precision.BF16_MIXED,
    checkpointing: Checkpointing = Checkpointing.NONE,
    sharding: Annotated[Sharding | None, typer.Option(help="default: none on one GPU, ddp on several")] = None,
    offload: Offload = Offload.NONE,
    loss: Loss = Loss.STANDARD,
    attention: Attention = Attention.SDPA,
    micro_batch_size: Annotated[int, typer.Option("--micro-batch-size", "--mbs", help="sequences per GPU per micro-batch")] = 1,
    grad_accum: Annotated[int, typer.Option(help="gradient accumulation steps")] = 1,
    seq_len: Annotated[int | None, typer.Option(help="tokens per sequence (default: 2048, or the model's position limit if shorter)")] = None,
    host_memory_gb: Annotated[float | None, typer.Option(help="host RAM per node, GB (default: 2x the node's GPU memory, >= 64)")] = None,
    inter_node_gbps: Annotated[float | None, typer.Option(help="network bandwidth per node, Gbit/s (default: 200 per GPU)")] = None,
    margin: Annotated[float, typer.Option(help="fraction of GPU memory to keep free, e.g. 0.05")] = 0.0,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    from planner.engine.estimate import EstimateRequest
    from planner.engine.estimate import estimate as run_estimate

    _serve(lambda: run_estimate(EstimateRequest(
            model=model, gpus=gpus, host_memory_gb=host_memory_gb, inter_node_gbps=inter_node_gbps, margin=margin,
            optimizer=optimizer,
            precision=precision, checkpointing=checkpointing, sharding=sharding, offload=offload, loss=loss,
            attention=attention, micro_batch_size=micro_batch_size, grad_accum=grad_accum, seq_len=seq_len,
    )), "render_estimate", as_json)


@app.command(help=f"Search every configuration and print the fastest plans that fit. {EXIT_CODES.replace('fits', 'a plan fits').replace('does not fit or infeasible', 'nothing fits')}")
def suggest(
    model: ModelOpt,
    gpus: GpusOpt,
    optimizer: OptimizersOpt = None,
    precision: PrecisionsOpt = None,
    checkpointing: CheckpointingsOpt = None,
    sharding: ShardingsOpt = None,
    offload: OffloadsOpt = None,
    loss: LossesOpt = None,
    attention: AttentionsOpt = None,
    micro_batch_size: MicroBatchesOpt = None,
    seq_len: SeqLenOpt = None,
    global_batch_size: GlobalBatchOpt = None,
    exact_optimizer: ExactOptimizerOpt = False,
    margin: MarginOpt = 0.0,
    top: Annotated[int, typer.Option(help="how many plans to show")] = 5,
    host_memory_gb: HostMemoryOpt = None,
    inter_node_gbps: InterNodeOpt = None,
    engine: Annotated[str, typer.Option(help="auto | exhaustive | tpe | nsga2 (auto: exhaustive up to 200,000 candidates)")] = "auto",
    out: Annotated[Path | None, typer.Option(help="write the winner's launch files here (accelerate, DeepSpeed, Trainer, launch.sh, PLAN.md)")] = None,
    force: Annotated[bool, typer.Option("--force", help="overwrite files already in --out")] = False,
    trials: Annotated[int, typer.Option(help="Optuna trials (tpe / nsga2 engines)")] = 400,
    seed: Annotated[int, typer.Option(help="Optuna sampler seed")] = 0,
    probe: Annotated[int, typer.Option(help="measure the top K plans on this machine's GPU (a real short run each, in a child process; kept in the calibration store); the fastest measured plan is the winner --out writes. Exit 2 without a GPU.")] = 0,
    probe_timeout: Annotated[float, typer.Option(help="seconds per measured probe")] = 900.0,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    from planner.engine.suggest import SuggestRequest
    from planner.engine.suggest import suggest as run_suggest

    space = _space_fields(locals())

    def plan_and_emit():
        device = None
        if probe:
            if probe < 0:
                raise PlannerInputError(f"--probe {probe}: how many of the top plans to measure, e.g. 3")
            from probes.measured_command import require_gpu

            device = require_gpu()  # before the search: no GPU, no wait
        result = run_suggest(SuggestRequest(**space, top=top, engine=engine, trials=trials, seed=seed))
        winner, served = 1, result
        if device is not None and result.fits:
            from probes.measured_command import probe_suggestion

            served = probe_suggestion(result, probe, device, probe_timeout)
            winner = served.best_rank or 1
        if out is not None and result.fits:
            from planner.emit import emit as write_plan

            for path in write_plan(result, out, force, rank=winner):
                err.print(f"wrote {path}", highlight=False)
        return served

    renderer: str | Callable = "render_suggest"
    if probe:
        from probes.measured_command import render_probed

        renderer = render_probed
    _serve(plan_and_emit, renderer, as_json)


@app.command(help="Write a plan's launch files: accelerate_config.yaml, deepspeed_config.json (ZeRO), "
             "training_args.json, launch.sh, plan.json, PLAN.md. Exit codes: 0 written, 1 the plan does not fit "
             "(files still written, PLAN.md says so), 2 bad input.")
def emit(
    plan: Annotated[Path, typer.Option(help="planner suggest --json output, an emitted plan.json, or planner estimate --json output")],
    out: Annotated[Path, typer.Option(help="directory to write into")],
    rank: Annotated[int, typer.Option(help="which plan of a suggest result (1 = best)")] = 1,
    gpus: Annotated[str | None, typer.Option(help="override the plan's GPUs (needed for a custom GPU YAML)")] = None,
    force: Annotated[bool, typer.Option("--force", help="overwrite files already in --out")] = False,
) -> None:
    from planner.emit import build_files, load_plan_file, write_files

    try:
        search = load_plan_file(plan)
        files = build_files(search, rank, gpus)
        for path in write_files(files, out, force):
            typer.echo(f"wrote {path}")
    except PlannerInputError as e:
        _fail(e)
    raise typer.Exit(EXIT_FITS if search.plans[rank - 1].fits else EXIT_DOES_NOT_FIT)


CHECK_EXIT_CODES = "Exit codes: 0 fits, 1 will not fit, 2 bad input (unreadable file, unknown key, contradiction)."


@app.command(help="Will this job fit? Reads the job's own files (accelerate YAML, DeepSpeed JSON, Trainer "
             f"arguments JSON/YAML, any subset, or --job-dir); flags fill gaps or override. {CHECK_EXIT_CODES}")
def check(
    model: Annotated[str, typer.Option(help="HF id from the catalog or local HF cache, or a config.json / model folder")],
    gpus: Annotated[str, typer.Option(help="[NODES x] [GPUS x] GPU, e.g. 1xA100-40, 8xH100-80, 4x8xH100-80")],
    accelerate_config: Annotated[Path | None, typer.Option(help="the job's accelerate config YAML")] = None,
    deepspeed_config: Annotated[Path | None, typer.Option(help="the job's DeepSpeed JSON")] = None,
    training_args: Annotated[Path | None, typer.Option(help="the job's Trainer arguments (JSON or YAML)")] = None,
    job_dir: Annotated[Path | None, typer.Option(help="a directory holding those files (and plan.json), e.g. from suggest --out")] = None,
    optimizer: Optimizer | None = None,
    precision: Precision | None = None,
    checkpointing: Checkpointing | None = None,
    sharding: Sharding | None = None,
    offload: Offload | None = None,
    loss: Loss | None = None,
    attention: Attention | None = None,
    micro_batch_size: Annotated[int | None, typer.Option("--micro-batch-size", "--mbs")] = None,
    grad_accum: int | None = None,
    seq_len: Annotated[int | None, typer.Option(help="tokens per sequence (files rarely say; default 2048)")] = None,
    margin: Annotated[float, typer.Option(help="fraction of GPU memory to keep free, e.g. 0.05")] = 0.0,
    host_memory_gb: Annotated[float | None, typer.Option(help="host RAM per node, GB")] = None,
    inter_node_gbps: Annotated[float | None, typer.Option(help="network bandwidth per node, Gbit/s")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    from planner.check.preflight import CheckRequest
    from planner.check.preflight import check as run_check

    _serve(lambda: run_check(CheckRequest(
        model=model, gpus=gpus, accelerate_config=accelerate_config, deepspeed_config=deepspeed_config,
        training_args=training_args, job_dir=job_dir, optimizer=optimizer, precision=precision,
        checkpointing=checkpointing, sharding=sharding, offload=offload, loss=loss, attention=attention,
        micro_batch_size=micro_batch_size, grad_accum=grad_accum, seq_len=seq_len, margin=margin,
        host_memory_gb=host_memory_gb, inter_node_gbps=inter_node_gbps,
    )), "render_check", as_json)


@app.command(help="List the model catalog (ids usable with --model).")
def models() -> None:
    from planner.catalog.models import catalog, resolve_model
    from planner.cost.params import total_parameters
    from planner.core.formatting import count

    for mid in sorted(catalog(), key=str.lower):
        spec = resolve_model(mid)
        console = Console(highlight=False)
        console.print(f"{mid:55s} {spec.family:8s} {count(total_parameters(spec)):>9s}")


@app.command(help="List the GPU catalog (names usable with --gpus).")
def gpus() -> None:
    from planner.catalog.gpus import catalog

    console = Console(highlight=False)
    for gid, f in sorted(catalog().items()):
        bf16 = f.dense_tflops.get("bf16")
        fp8 = f.dense_tflops.get("fp8")
        console.print(
            f"{gid:14s} {f.memory_mib / 1024:7.1f} GiB  bf16 {bf16 or '-':>7} TFLOP/s  fp8 {fp8 or '-':>7}  "
            f"{f.gpu_link.kind}  aliases: {', '.join(f.aliases)}"
        )


PROBE_EXIT_CODES = ("Exit codes: 0 the probe agrees with the analytic model, 1 it differs (measured: or ran out of "
                    "memory where a fit was predicted), 2 bad input or no GPU for --fidelity measured, 3 the probe "
                    "failed (crash, timeout).")


@app.command(help="Probe a plan and compare it with the cost model. --fidelity traced: the real model on fake "
                  "tensors (CPU, no GPU), every memory term. --fidelity measured: a short real run on this "
                  "machine's GPU in a child process (peaks, OOM, step time), kept in the calibration store. "
                  f"Give the plan as flags or as --plan FILE. Needs the [probes] extra. {PROBE_EXIT_CODES}")
def probe(
    model: Annotated[str | None, typer.Option(help="HF id from the catalog or local HF cache, or a config.json / model folder")] = None,
    gpus: Annotated[str | None, typer.Option(help="the plan's GPUs; their count is FSDP's world size, e.g. 8xH100-80")] = None,
    plan: Annotated[Path | None, typer.Option(help="probe a planned config: planner suggest --json output, an emitted plan.json, or planner estimate --json output (instead of --model, --gpus and the config flags)")] = None,
    rank: Annotated[int, typer.Option(help="with --plan: which plan of a suggest result (1 = best)")] = 1,
    fidelity: Annotated[str, typer.Option(help="traced: FakeTensorMode + MemTracker on this machine's CPU; measured: a real run on this machine's GPU")] = "traced",
    optimizer: Optimizer = Optimizer.ADAMW,
    precision: Precision = Precision.BF16_MIXED,
    checkpointing: Checkpointing = Checkpointing.NONE,
    sharding: Annotated[Sharding | None, typer.Option(help="none, fsdp, fsdp-grad-op (one rank), ddp, zero1-3 (traced: activations traced, ZeRO states computed; measured: DeepSpeed under a fake process group); default: none on one GPU, ddp on several")] = None,
    offload: Offload = Offload.NONE,
    loss: Loss = Loss.STANDARD,
    attention: Attention = Attention.SDPA,
    micro_batch_size: Annotated[int, typer.Option("--micro-batch-size", "--mbs")] = 1,
    grad_accum: Annotated[int, typer.Option(help="gradient accumulation steps (measured only)")] = 1,
    seq_len: Annotated[int | None, typer.Option(help="tokens per sequence (default as estimate)")] = None,
    layers: Annotated[int | None, typer.Option(help="probe a reduced depth (default: the full model)")] = None,
    extrapolate_from: Annotated[str | None, typer.Option(help="measured: two reduced depths, e.g. 2,4, the full depth extrapolated from them (big models on one GPU); a third, e.g. 2,4,8, checks that memory is linear in depth")] = None,
    steps: Annotated[int, typer.Option(help="measured: timed optimizer steps")] = 5,
    warmup_steps: Annotated[int, typer.Option(help="measured: untimed steps first")] = 2,
    timeout: Annotated[float, typer.Option(help="seconds before a probe's child process is stopped")] = 1800.0,
    explain: Annotated[bool, typer.Option("--explain", help="traced: list the tensors alive at the traced peak")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    from probes.command import EXIT_AGREE, EXIT_DISAGREE, ProbeRequest, render_probe, run_probe

    def run():
        fields = dict(model=model, gpus=gpus, optimizer=optimizer, precision=precision, checkpointing=checkpointing,
                      sharding=sharding, offload=offload, loss=loss, attention=attention,
                      micro_batch_size=micro_batch_size, grad_accum=grad_accum, seq_len=seq_len)
        if plan is not None:
            from probes.measured_command import plan_fields

            fields = plan_fields(plan, rank)
        elif model is None or gpus is None:
            raise PlannerInputError("give the plan: --model and --gpus (and config flags), or --plan FILE")
        request = ProbeRequest(**fields, fidelity=fidelity, layers=layers, timeout=timeout, explain=explain,
                               extrapolate_from=_depths(extrapolate_from), steps=steps, warmup_steps=warmup_steps)
        if fidelity == "measured":
            from probes.measured_command import run_measured_probe

            return run_measured_probe(request)
        return run_probe(request)

    def exit_code(result) -> int:
        if getattr(result, "status", "ok") in ("error", "timeout", "refused"):
            return EXIT_PROBE_FAILED
        return EXIT_AGREE if result.agrees else EXIT_DISAGREE

    renderer: Callable = render_probe
    if fidelity == "measured":
        from probes.measured_command import render_measured

        renderer = render_measured
    _serve(run, renderer, as_json, exit_code, probe=True)


def _depths(text: str | None) -> list[int]:
    """``--extrapolate-from 2,4`` -> [2, 4] (or three depths)."""
    if not text:
        return []
    try:
        depths = [int(x) for x in text.split(",")]
    except ValueError:
        raise PlannerInputError(f"--extrapolate-from {text!r}: two or three depths, e.g. 2,4") from None
    if len(depths) not in (2, 3) or min(depths) < 1:
        raise PlannerInputError(f"--extrapolate-from {text!r}: two or three depths of at least one layer, e.g. 2,4")
    return depths


TUNE_EXIT_CODES = "Exit codes: 0 a probed plan fits (the best is shown and written), 1 none does, 2 bad input."


@app.command(help="Find the fastest plan by measurement: an Optuna study over suggest's search space that spends "
                  "--trials probes (measured on this machine's GPU; without one, traced memory and analytic time), "
                  "skips what the analytic model rejects, resumes where it stopped, and can be shared by workers "
                  f"(--storage). {TUNE_EXIT_CODES}")
def tune(
    model: ModelOpt,
    gpus: GpusOpt,
    trials: Annotated[int, typer.Option(help="probes to spend, over the whole study (a resumed tune continues the count; 0 reports an existing study's best and writes its files, probing nothing)")] = 20,
    timeout: Annotated[float | None, typer.Option(help="seconds for this run (the study resumes later)")] = None,
    fidelity: Annotated[str, typer.Option(help="auto (measured with a GPU, else traced) | measured | traced | analytic")] = "auto",
    band: Annotated[float, typer.Option(help="the model's relative error on throughput: stop when no unprobed candidate can beat the best probed one by more")] = 0.15,
    storage: Annotated[str | None, typer.Option(help="an Optuna storage URL shared by workers (default: sqlite:///OUT/study.db, or ./planner-tune.db)")] = None,
    study_name: Annotated[str | None, typer.Option(help="default: from the model, GPUs, fidelity and search space")] = None,
    out: Annotated[Path | None, typer.Option(help="write the best plan's launch files, tune.png and the study file here")] = None,
    force: Annotated[bool, typer.Option("--force", help="overwrite files already in --out")] = False,
    optimizer: OptimizersOpt = None,
    precision: PrecisionsOpt = None,
    checkpointing: CheckpointingsOpt = None,
    sharding: ShardingsOpt = None,
    offload: OffloadsOpt = None,
    loss: LossesOpt = None,
    attention: AttentionsOpt = None,
    micro_batch_size: MicroBatchesOpt = None,
    seq_len: SeqLenOpt = None,
    global_batch_size: GlobalBatchOpt = None,
    exact_optimizer: ExactOptimizerOpt = False,
    margin: MarginOpt = 0.0,
    host_memory_gb: HostMemoryOpt = None,
    inter_node_gbps: InterNodeOpt = None,
    enqueue: Annotated[int, typer.Option(help="the analytic model's top candidates probed first")] = 5,
    probe_timeout: Annotated[float, typer.Option(help="seconds per probe")] = 900.0,
    heartbeat_seconds: Annotated[int, typer.Option(help="a dead worker's trial is retried after twice this")] = 30,
    seed: Annotated[int, typer.Option(help="Optuna sampler seed")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    from planner.engine.tune import FIDELITIES, TuneRequest
    from planner.engine.tune import tune as run_tune

    space = _space_fields(locals())

    def run():
        if fidelity not in FIDELITIES:
            raise PlannerInputError(f"--fidelity {fidelity!r}", hint=f"One of: {', '.join(FIDELITIES)}.")
        if out is not None and not force:
            from planner.emit import FILE_NAMES

            existing = sorted(n for n in FILE_NAMES if (out / n).exists())
            if existing:  # say so before any probe is spent
                raise PlannerInputError(f"{out} already has {', '.join(existing)}", hint="Pass --force to overwrite them.")
        request = TuneRequest(
            **space, seed=seed, fidelity=fidelity, band=band, probes=trials, timeout=timeout,
            probe_timeout=probe_timeout, storage=storage, study_name=study_name, out=out, enqueue=enqueue,
            heartbeat_seconds=heartbeat_seconds)
        from planner.render.tune import Progress, plot
        from probes.tune_probes import choose

        chosen, probe, notes = choose(fidelity, probe_timeout)
        with Progress(trials, chosen, err) as progress:
            result = run_tune(request, probe, chosen, progress.update, notes)
        if out is not None and result.best_plan is not None:
            from planner.emit import emit as write_plan
            from planner.emit import single_plan_result

            for path in write_plan(single_plan_result(result.best_plan), out, force):
                err.print(f"wrote {path}", highlight=False)
            picture = plot(result, out / "tune.png")
            err.print(f"wrote {picture}" if picture else "no tune.png: pip install matplotlib for the plot", highlight=False)
        return result

    _serve(run, _render_tune, as_json)


def _render_tune(result, console) -> None:
    from planner.render.tune import render_tune

    render_tune(result, console)


CALIBRATE_EXIT_CODES = ("Exit codes: 0 fitted, 1 nothing to fit (no measurement with status ok), "
                        "2 bad input (no store, no measurements).")


@app.command(help="Fit the analytic model to measured probes (planner probe --fidelity measured): per GPU the CUDA "
                  "context, the allocator's fragmentation reserve and achieved FLOP/s per compute dtype. Saves them "
                  f"in the calibration store, where estimate, suggest and check use them. {CALIBRATE_EXIT_CODES}")
def calibrate(
    store: Annotated[Path | None, typer.Option(help="the calibration store (default: $PLANNER_CALIBRATION, else ~/.cache/planner/calibration.sqlite)")] = None,
    gpu: Annotated[str | None, typer.Option(help="fit only the measurements taken on this GPU (catalog id or alias)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="fit and print; save nothing")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    from planner.engine.calibrate import EXIT_FITTED, EXIT_NOTHING_TO_FIT, CalibrateRequest
    from planner.engine.calibrate import calibrate as run_calibrate

    _serve(lambda: run_calibrate(CalibrateRequest(store=store, gpu=gpu, dry_run=dry_run)), "render_calibrate", as_json,
           lambda result: EXIT_FITTED if result.fitted else EXIT_NOTHING_TO_FIT)


def main() -> None:
    app()
