"""The command line's options: typed aliases shared by every planning command, and one option per
registered technique (``with_techniques``), so a new strategy is a flag of every command that
plans without touching this package."""

import functools
import inspect
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, cast

import typer

from planner.catalog.calibration import ENV as CALIBRATION_ENV
from planner.core.launch_contract import Launcher
from planner.core.lengths import Batching
from planner.core.numerics import NumericsPolicy, ladder_phrase
from planner.cost.overheads import DEFAULT_MARGIN
from planner.strategies import BY_FIELD, LADDER, SETTINGS, TECHNIQUES

#: --help panels: each sizes its own columns, so long flag names do not narrow every help text.
HOST_PANEL = "Host, network and calibration"
TECHNIQUES_PANEL = "Techniques (docs/reference.md: what each value means)"
Model = Annotated[str, typer.Option("--model", metavar="ID",
                                    help="HF id from the catalog or local HF cache, or a config.json / model folder")]
Gpus = Annotated[str, typer.Option("--gpus", metavar="SPEC",
                                   help="[NODES x] [GPUS x] GPU, e.g. 1xA100-40, 8xH100-80, 4x8xH100-80, 2x./gpu.yaml")]
Margin = Annotated[float, typer.Option("--margin", metavar="FRAC",
                                       help="GPU memory kept free for the model's error (0: none)")]
Numerics = Annotated[NumericsPolicy, typer.Option(
    "--numerics", metavar="POLICY", show_choices=False,
    help=f"ladder: exact plans, else the least approximation ({ladder_phrase(LADDER, short=True)}); exact: exact only; "
         "any: the fastest")]


def _host_rate(flag: str, metavar: str, words: str):
    """An optional number of the host, network or measured-rate panel (``words``: its help)."""
    return Annotated[float | None, typer.Option(flag, metavar=metavar, rich_help_panel=HOST_PANEL, help=words)]


HostMemory = _host_rate("--host-memory-gb", "GB", "host RAM per node, GB (default: 2x the node's GPU memory, >= 64)")
InterNode = _host_rate("--inter-node-gbps", "GBPS", "network bandwidth per node, Gbit/s (default: 200 per GPU)")
PageMigration = _host_rate("--page-migration-gb-s", "GB/S",
                           "paged optimizer state's migration rate, GB/s (default: measured beside the GPU, else assumed)")
CpuOptimizer = _host_rate("--cpu-optimizer-gparams-s", "RATE", "CPU optimizer (offload) speed, billion parameters a second "
                          "per node (default: measured beside the GPU, else 1)")
Calibration = Annotated[str | None, typer.Option(
    "--calibration", metavar="PATH", rich_help_panel=HOST_PANEL, envvar=CALIBRATION_ENV, show_envvar=True,
    help="the calibration store whose measured corrections apply (planner calibrate), or 'off' "
         "(default: calibration.sqlite in ~/.cache/planner)")]
SeqLen = Annotated[int | None, typer.Option("--seq-len", metavar="N", help="tokens per sequence "
                                                              "(default: 2048, or the model's position limit if shorter)")]
BatchingOption = Annotated[Batching | None, typer.Option(
    "--batching", metavar="HOW", show_choices=False,
    help="packed (samples concatenated into full sequences), padded (one sample per sequence, each "
         "micro-batch padded to its longest) or padded-max (padded to --seq-len); default: packed, or padded "
         "with --lengths")]
LengthsFile = Annotated[Path | None, typer.Option(
    "--lengths", metavar="FILE",
    help="your samples' token counts: one per line, 'tokens count' pairs, or JSON lines with input_ids or "
         "'length'; padded plans time the expected micro-batch and fit the longest")]
MicroBatch = Annotated[int, typer.Option("--micro-batch-size", "--mbs", metavar="N", help="sequences per GPU per micro-batch")]
MicroBatches = Annotated[list[int] | None, typer.Option(
    "--micro-batch-size", "--mbs", metavar="N",
    help="allow only these (repeatable); default: every divisor of the per-GPU share of the global batch")]
GradAccum = Annotated[int, typer.Option("--grad-accum", metavar="N", help="gradient accumulation steps")]
GlobalBatch = Annotated[int | None, typer.Option(
    "--global-batch-size", metavar="N",
    help="sequences per optimizer step over all GPUs (default: the smallest GPUs x 2^k holding >= 131,072 tokens: "
         "64 x 2048)")]
LauncherOption = Annotated[Launcher, typer.Option(
    "--launcher", metavar="WHO", show_choices=False,
    help="planner (python -m planner.launch: every plan) or trainer (your own Trainer script: plans the "
         "standard files say alone)")]
ExactOptimizer = Annotated[bool, typer.Option("--exact-optimizer", help="exclude quantized (8-bit) optimizer states")]
Json = Annotated[bool, typer.Option("--json", help="print the result as JSON")]
Out = Annotated[Path | None, typer.Option("--out", metavar="DIR", help="write the plan's launch files here "
                                                        "(accelerate, DeepSpeed, Trainer, launch.sh, PLAN.md)")]
Force = Annotated[bool, typer.Option("--force", help="overwrite files already in --out")]
Seed = Annotated[int, typer.Option("--seed", metavar="N", help="Optuna sampler seed")]


def calibration_store(value: str | None) -> Path | None:
    """``--calibration``: a store file, 'off' (none), or unset (the default store)."""
    from planner.catalog.calibration import OFF, store_path

    if value is None:
        return store_path()
    return None if value.strip().lower() in OFF else Path(value).expanduser()


def _extend(command, name: str, added: list[inspect.Parameter], collect):
    """``command`` with ``added`` options in its signature; they reach it as one keyword argument,
    ``name=collect(values)``. The added options go after model and gpus."""
    signature = inspect.signature(command)
    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in signature.parameters.values() if p.name != name]
    split = next((i for i, p in enumerate(own) if p.name not in ("model", "gpus")), len(own))
    names = [p.name for p in added]

    @functools.wraps(command)
    def run(**kwargs):
        return command(**{name: collect({n: kwargs.pop(n) for n in names})}, **kwargs)

    setattr(run, "__signature__", signature.replace(parameters=own[:split] + added + own[split:]))  # noqa: B010
    return run


def _option(name: str, annotation, default=None) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


ModelFromFiles = Annotated[str | None, typer.Option(
    "--model", metavar="ID",
    help="HF id from the catalog or local HF cache, or a config.json / model folder (default: the model the recipe names)")]


def with_target(command, model_from_files: bool = False):
    """Give a planning command the options of what it plans for: --model, --gpus, --margin,
    --host-memory-gb, --inter-node-gbps, --page-migration-gb-s, --cpu-optimizer-gparams-s,
    --calibration; it is called with ``target={...}``, the
    fields of a PlanTarget (the calibration store resolved). ``model_from_files``: --model may be
    left out (check: the recipe names it)."""
    model = _option("model", ModelFromFiles, None) if model_from_files else _option("model", Model, inspect.Parameter.empty)
    added = [model, _option("gpus", Gpus, inspect.Parameter.empty),
             _option("margin", Margin, DEFAULT_MARGIN), _option("host_memory_gb", HostMemory),
             _option("inter_node_gbps", InterNode), _option("page_migration_gb_s", PageMigration),
             _option("cpu_optimizer_gparams_s", CpuOptimizer), _option("calibration", Calibration)]
    return _extend(command, "target", added, lambda v: v | {"calibration": calibration_store(v["calibration"])})


def with_space(command):
    """Give a searching command (suggest, tune) the options that shape its search space:
    --micro-batch-size, --seq-len, --batching, --lengths, --global-batch-size, --exact-optimizer, --launcher,
    --numerics; it is called
    with ``space={...}``, SuggestRequest fields."""
    added = [_option("micro_batch_size", MicroBatches), _option("seq_len", SeqLen), _option("batching", BatchingOption),
             _option("lengths", LengthsFile), _option("global_batch_size", GlobalBatch),
             _option("exact_optimizer", ExactOptimizer, False), _option("launcher", LauncherOption, Launcher.PLANNER),
             _option("numerics", Numerics, NumericsPolicy.LADDER)]
    return _extend(command, "space", added, lambda v: v | {"micro_batch_size": v["micro_batch_size"] or []})


ANY = "any"


@functools.cache
def _with_any(enum: type[StrEnum]) -> type[StrEnum]:
    """The choices of ``enum`` and "any" (every choice), for a searching command's flag."""
    make = cast(Callable[..., type[StrEnum]], StrEnum)  # (its functional API, with a computed name)
    return make(enum.__name__ + "OrAny", {m.name: m.value for m in enum} | {"ANY": ANY})


def with_techniques(kind: str):
    """Give a command one option per registered technique, in vocabulary order, and call it with
    ``techniques={field: value}``.

    ``kind``: "one" (a value; None: the technique's default, e.g. sharding none on one GPU, ddp on
    several), "optional" (None: from the files, as ``planner check`` reads them), "many" (repeatable:
    the search may use only these; empty: every value it searches; "any", where the strategy takes
    it: every choice). Each technique's settings (--lora-rank, ...) are one optional value in every
    kind (None: the default, or for check what the files say)."""

    def option(s):
        if kind == "many":  # short: the values; what each means is in docs/reference.md and estimate --help
            values = [str(v) for v in s.enum]
            searched = [str(v) for v in s.searched] if s.searched else values
            named = [v for v in values if v not in searched]
            when = f"when named or {s.searched_from}" if s.searched_from else "only when named"
            unless = f" ({', '.join(named)}: {when})" if named else ""
            enum = _with_any(s.enum) if s.any_choice else s.enum
            anyword = ", any" if s.any_choice else ""
            return Annotated[list[enum] | None,
                             typer.Option(s.flag, metavar="VALUE", show_choices=False, rich_help_panel=TECHNIQUES_PANEL,
                                          help=f"only these, repeatable: {', '.join(values)}{anyword}{unless}")]
        fallback = "from the files" if kind == "optional" else (
            f"default: {s.default}" if s.default_for is None else f"default: {(s.default_for.__doc__ or '').strip(' .')}")
        return Annotated[s.enum | None, typer.Option(s.flag, metavar="VALUE", show_choices=False,
                                                     rich_help_panel=TECHNIQUES_PANEL, help=f"{s.help} ({fallback})")]

    def setting(x):
        fallback = "from the files" if kind == "optional" else f"default: {x.default}"
        return Annotated[x.type | None, typer.Option(x.flag, metavar="VALUE", show_choices=False,
                                                     rich_help_panel=TECHNIQUES_PANEL, help=f"{x.help} ({fallback})")]

    def collect(values: dict) -> dict:
        if kind != "many":
            return values
        out = {}
        for k, v in values.items():
            s = BY_FIELD.get(k)
            if s is None:  # a setting: one value
                out[k] = v
            elif s.any_choice and v and ANY in v:
                out[k] = list(s.choices)
            else:
                out[k] = [s.enum(x) for x in v or []]
        return out

    def decorate(command):
        added = [_option(s.field, option(s)) for s in TECHNIQUES] + [_option(x.name, setting(x)) for x in SETTINGS]
        return _extend(command, "techniques", added, collect)

    return decorate
