"""The command line: thin. Options become one request model; one function plans; exit codes.

Exit codes: 0 fits, 1 does not fit or infeasible, 2 bad input.
"""

import json
import sys
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console

from planner.errors import EXIT_BAD_INPUT, EXIT_DOES_NOT_FIT, EXIT_FITS, PlannerInputError
from planner.vocabulary import Attention, Checkpointing, Loss, Offload, Optimizer, Precision, Sharding

EXIT_CODES = "Exit codes: 0 fits, 1 does not fit or infeasible, 2 bad input."
app = typer.Typer(
    help=f"planner: the fastest LLM training configuration that fits your GPUs. {EXIT_CODES}",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)


def _fail(e: PlannerInputError) -> None:
    err.print(f"[bold red]error:[/] {e.message}", highlight=False)
    raise typer.Exit(EXIT_BAD_INPUT)


def _validation_problems(e: ValidationError) -> list[str]:
    return [f"--{'-'.join(map(str, er['loc'])).replace('_', '-')}: {er['msg']}" for er in e.errors()]


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
    seq_len: Annotated[int, typer.Option(help="tokens per sequence")] = 2048,
    host_memory_gb: Annotated[float | None, typer.Option(help="host RAM per node, GB (default: 2x the node's GPU memory, >= 64)")] = None,
    margin: Annotated[float, typer.Option(help="fraction of GPU memory to keep free, e.g. 0.05")] = 0.0,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    from planner.estimate import EstimateRequest
    from planner.estimate import estimate as run_estimate

    try:
        request = EstimateRequest(
            model=model, gpus=gpus, host_memory_gb=host_memory_gb, margin=margin, optimizer=optimizer,
            precision=precision, checkpointing=checkpointing, sharding=sharding, offload=offload, loss=loss,
            attention=attention, micro_batch_size=micro_batch_size, grad_accum=grad_accum, seq_len=seq_len,
        )
        result = run_estimate(request)
    except ValidationError as e:
        _fail(PlannerInputError(_validation_problems(e)))
    except PlannerInputError as e:
        _fail(e)
    if as_json:
        sys.stdout.write(json.dumps(result.model_dump(mode="json"), indent=2) + "\n")
    else:
        from planner.report import console_for_stdout, render_estimate

        render_estimate(result, console_for_stdout())
    raise typer.Exit(EXIT_FITS if result.fits else EXIT_DOES_NOT_FIT)


@app.command(help="List the model catalog (ids usable with --model).")
def models() -> None:
    from planner.catalog.models import catalog, resolve_model
    from planner.cost.params import total_parameters
    from planner.formatting import count

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


def main() -> None:
    app()
