"""Emit a plan as the files its users launch with.

accelerate_config.yaml, deepspeed_config.json (ZeRO plans), training_args.json (transformers
TrainingArguments), runtime.json (what the planner launch applies beyond them,
planner.core.launch_contract), launch.sh, plan.json (the suggest JSON of this plan; no launch reads it) and
PLAN.md. Each technique's piece comes from its strategy (``Strategy.emit``); this module adds the
plan-wide keys and renders the launch script (user text in it only as escaped comments:
planner.core.shell); planner/emit/writer.py writes the set as one plan, never over a file the user
has (with ``force``, over planner's own unchanged files only).

launch.sh runs ``accelerate launch`` with the files and planner's entry point
(``python -m planner.launch``: the user's model and data, the HF Trainer, runtime.json applied), or
with the user's own script (``TRAIN_SCRIPT``), which then has only the standard files.
"""

import json
from collections.abc import Mapping
from pathlib import Path

import yaml
from pydantic import ValidationError

from planner import __version__
from planner.catalog.files import read_document
from planner.catalog.models import resolve_model
from planner.core import shell
from planner.core.emitted import EmitDraft
from planner.core.errors import PlannerInputError
from planner.core.launch_contract import LAUNCH_ENV, RUNTIME_FILE
from planner.core.numerics import NumericsPolicy
from planner.core.vocabulary import PADDED_METHODS
from planner.emit import writer
from planner.emit.plan_doc import render_plan_doc
from planner.emit.writer import Written
from planner.engine.alternatives import memory_savers
from planner.engine.estimate import estimate_config
from planner.schema.estimate import EstimateResult
from planner.schema.suggest import SuggestResult
from planner.strategies import REGISTRY, Engine, PlanContext, numerics_of, summary

FILE_NAMES = ("accelerate_config.yaml", "deepspeed_config.json", "training_args.json", RUNTIME_FILE, "launch.sh",
              "plan.json", "PLAN.md")
#: Files a command writes beside a plan's (planner tune's plot): planner's too, replaced with the plan.
EXTRA_NAMES = ("tune.png",)
MAIN_PORT = 29500


def load_plan_file(path: Path) -> SuggestResult:
    """A suggest JSON (``planner suggest --json`` or an emitted plan.json), or one plan object
    (``planner estimate --json``), as a SuggestResult."""
    hint = "Pass the JSON of `planner suggest --json`, an emitted plan.json, or `planner estimate --json`."
    data = read_document(path, "plan file", hint, kind="JSON")
    try:
        if isinstance(data, dict) and "plans" in data:
            return SuggestResult.model_validate(data)
        plan = EstimateResult.model_validate(data)
    except ValidationError as e:
        problems = [f"{path}: {'.'.join(map(str, er['loc']))}: {er['msg']}" for er in e.errors()[:10]]
        raise PlannerInputError(problems, hint=hint) from None
    return single_plan_result(plan)


def single_plan_result(plan: EstimateResult, search: SuggestResult | None = None) -> SuggestResult:
    """The suggest JSON of one plan: the plan, and the search that chose it when there was one."""
    return SuggestResult(
        plans=[plan],
        considered=search.considered if search else 1,
        rejected=search.rejected if search else {},
        evaluated=search.evaluated if search else 1,
        engine=search.engine if search else "estimate",
        global_batch_size=plan.config.sequences_per_step(plan.hardware.num_gpus),
        seq_len=plan.config.seq_len,
        fits=plan.fits,
        nearest=[],
        hardware_suggestions=[],
        reasons=search.reasons if search else plan.reasons,
        numerics=search.numerics if search else NumericsPolicy.ANY,  # one plan, taken as it is
        exact_fits=search.exact_fits if search else numerics_of(plan.config) == (),
        trade_offs=search.trade_offs if search else [],
        assumptions=search.assumptions if search else plan.assumptions,
        training=search.training if search else None,
    )


def build_files(search: SuggestResult, rank: int = 1, gpus: str | None = None,
                calibration: Path | None = None) -> dict[str, str]:
    """File name -> content for the plan at ``rank`` (1 = best) of a suggest result, re-estimated
    with this planner (on ``gpus`` when given, with the corrections of the ``calibration`` store)."""
    if not 1 <= rank <= len(search.plans):
        one = len(search.plans) == 1
        raise PlannerInputError(
            f"--rank {rank}: the plan file holds {len(search.plans)} plan(s)"
            + (" (a plan.json written by `planner suggest --out` holds the plan it wrote)" if one else ""),
            hint=("Save the whole ranking with `planner suggest ... --json > ranked.json`, then run "
                  f"`planner emit --plan ranked.json --rank {rank} --out DIR`." if one else
                  f"Choose --rank from 1 to {len(search.plans)}."))
    old = search.plans[rank - 1]
    model = resolve_model(old.model.id)
    hardware = old.hardware.parse(gpus, calibration)
    margin = 1 - old.usable_bytes / old.hardware.gpu_memory_bytes
    plan = estimate_config(model, hardware, old.config, margin)  # with this planner's model
    ctx = PlanContext(model, hardware, plan.config)
    files = _draft(ctx)
    notes = list(files.notes)
    if plan.memory["peak"] != old.memory["peak"]:
        notes.append(f"re-estimated by planner {__version__}: peak {old.memory['peak']:,} -> {plan.memory['peak']:,} bytes")
    if not plan.fits:
        notes.append("WARNING: this plan does not fit: " + "; ".join(plan.reasons))
    out = {
        "accelerate_config.yaml": _yaml(files.accelerate),
        "training_args.json": _json(files.training_args),
        RUNTIME_FILE: _json(files.runtime),
        "launch.sh": launch_script(plan, files),
        "plan.json": _json(single_plan_result(plan, search).model_dump(mode="json")),
    }
    if files.deepspeed is not None:
        out["deepspeed_config.json"] = _json(files.deepspeed)
    savers = memory_savers(model, hardware, plan.config, margin, baseline=plan)
    out["PLAN.md"] = render_plan_doc(plan, search, rank, notes, files, savers, sorted(out) + ["PLAN.md"])
    return out


def _draft(ctx: PlanContext) -> EmitDraft:
    """Plan-wide keys first, then every strategy's fragment, in registry order."""
    cfg, hw = ctx.config, ctx.hardware
    files = EmitDraft()
    files.accelerate = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "downcast_bf16": "no",
        "machine_rank": 0,
        "main_training_function": "main",
        "num_machines": hw.nodes,
        "num_processes": hw.num_gpus,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
    }
    if hw.nodes > 1:
        files.accelerate["main_process_port"] = MAIN_PORT
    if ctx.engine == Engine.DEEPSPEED:
        files.deepspeed = {
            "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
            "gradient_accumulation_steps": cfg.grad_accum,
            "train_batch_size": cfg.sequences_per_step(ctx.layout.data_parallel),
            "gradient_clipping": 1.0,
            "steps_per_print": 100,
            "wall_clock_breakdown": False,
        }
    files.runtime = {"planner_version": __version__, "seq_len": cfg.seq_len}
    if str(cfg.method) not in PADDED_METHODS:  # (a DPO plan's trainer pads its pairs itself)
        files.runtime["batching"] = str(cfg.batching)
    files.extras.add("train")
    files.training_args = {
        "output_dir": "outputs",
        "per_device_train_batch_size": cfg.micro_batch_size,
        "gradient_accumulation_steps": cfg.grad_accum,
        "max_grad_norm": 1.0,
        "logging_steps": 10,
        "report_to": "none",
    }
    for strategy in REGISTRY:
        strategy.emit(ctx, files)
    return files


def launch_script(plan: EstimateResult, files: EmitDraft) -> str:
    """The launch: accelerate launch with the emitted files and planner's entry point (or the
    user's TRAIN_SCRIPT). Run from anywhere: every path is the script's own folder."""
    c, hw = plan.config, plan.hardware
    lines = [
        "#!/usr/bin/env bash",  # (user text, the model and the GPUs, reaches comments only: shell.comment)
        shell.comment(f"Launch {plan.model.id} on {plan.hardware.spec}: {summary(c)},"),
        shell.comment(f"micro-batch {c.micro_batch_size} x accumulation {c.grad_accum} x {hw.num_gpus} GPU(s), "
                      f"seq {c.seq_len}. Written by planner {__version__}; see PLAN.md."),
        "#",
        "#   MODEL=path/to/model DATA=path/to/train.jsonl ./launch.sh [--max-steps N ...]",
        "#     (python -m planner.launch --help lists the options; DATA=sample: a smoke test)",
        "#   TRAIN_SCRIPT=your_script.py ./launch.sh [its arguments]",
        "#     (your script reads training_args.json; runtime.json is what it must apply itself)",
    ]
    if str(c.method) == "grpo":
        lines += ["#   GRPO: DATA=prompts.jsonl (a prompt field) and --reward module:function (yours)"]
        if str(c.generation) == "vllm-server":
            lines += [f"#   (start trl vllm-serve on {c.vllm_gpus} other GPU(s) first: PLAN.md)"]
    if hw.nodes > 1:
        lines += [
            f"#   Run it on each of the {hw.nodes} machines with MACHINE_RANK=0..{hw.nodes - 1} and MAIN_ADDR set to",
            "#   the address of machine 0 (MAIN_PORT defaults to 29500).",
        ]
    lines += ['set -euo pipefail', 'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
              'if [[ -n "${TRAIN_SCRIPT:-}" ]]; then',
              '  ENTRY=("$TRAIN_SCRIPT")',
              'else',
              '  ENTRY=(-m planner.launch --job-dir "$HERE"',
              '         --model "${MODEL:?set MODEL to your model folder (or a Hugging Face id in the local cache)}"',
              '         --data "${DATA:?set DATA to your training data (JSONL with a text field), or sample for a smoke test}")',
              'fi']
    command = ['accelerate launch --config_file "$HERE/accelerate_config.yaml"']
    if hw.nodes == 1 and hw.num_gpus > 1:
        lines.append(f'MAIN_PORT="${{MAIN_PORT:-{MAIN_PORT}}}"')
        command.append('--main_process_port "$MAIN_PORT"')
    if hw.nodes > 1:
        lines += ['MACHINE_RANK="${MACHINE_RANK:?set MACHINE_RANK to the rank of this machine}"',
                  'MAIN_ADDR="${MAIN_ADDR:?set MAIN_ADDR to the address of machine rank 0}"',
                  f'MAIN_PORT="${{MAIN_PORT:-{MAIN_PORT}}}"']
        command.append('--machine_rank "$MACHINE_RANK" --main_process_ip "$MAIN_ADDR" --main_process_port "$MAIN_PORT"')
    if files.deepspeed is not None:  # accelerate reads the JSON path relative to the working directory
        command.append('--deepspeed_config_file "$HERE/deepspeed_config.json"')
    env = " ".join(f"{k}={shell.quote(v)}" for k, v in sorted(LAUNCH_ENV.items()))
    lines.append(f'export PLANNER_JOB_DIR="$HERE" {env}')
    lines.append("exec " + " \\\n  ".join(command + ['"${ENTRY[@]}" "$@"']))
    return "\n".join(lines) + "\n"


def write_files(files: Mapping[str, str | bytes], out: Path, force: bool) -> Written:
    """Write a plan's files into ``out`` (planner/emit/writer.py: a manifest of what planner wrote,
    writes that nothing redirects, one writer at a time): never over a file the user has, and
    with ``force`` over planner's own files only; planner files of an earlier plan this one does
    not have are removed."""
    return writer.write_files(files, out, force, FILE_NAMES + EXTRA_NAMES)


def foreign_plan_files(out: Path) -> list[str]:
    """The planner file names ``out`` holds that are not planner's own unchanged files (anything at
    the name: a user's file, an edited one, a dangling link), after finishing or undoing the write
    of a planner killed there (planner/emit/writer.py ``recover``)."""
    if not out.is_dir() or out.is_symlink():
        return []
    writer.recover(out)
    manifest = writer.read_manifest(out)
    return sorted(n for n in (*FILE_NAMES, *EXTRA_NAMES) if writer.present(out, n) and not writer.owned(out, n, manifest))


def emit(search: SuggestResult, out: Path, force: bool = False, rank: int = 1, gpus: str | None = None,
         calibration: Path | None = None, extra: dict[str, bytes] | None = None, replace_own: bool = False) -> Written:
    """Write the plan at ``rank`` of ``search`` into ``out``, with ``extra`` files (EXTRA_NAMES);
    ``replace_own``: planner's own unchanged files there are replaced without ``force``."""
    files: dict[str, str | bytes] = {**build_files(search, rank, gpus, calibration), **(extra or {})}
    return writer.write_files(files, out, force, FILE_NAMES + EXTRA_NAMES, replace_own)


def _yaml(data: dict) -> str:
    return yaml.safe_dump(data, sort_keys=True, default_flow_style=False)


def _json(data: dict) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"
