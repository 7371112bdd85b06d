"""`planner check`: will this job fit, before it is queued?

One function, `check(CheckRequest) -> CheckResult`, for the CLI and for launchers written in
Python. The job's own files (accelerate YAML, DeepSpeed JSON, Trainer arguments, and the runtime.json
of a planner launch) are mapped onto the vocabulary (planner.check.job_files); flags fill what the
files leave open or override it. A job directory that has a plan.json but no runtime.json (a job
launched with its own script) takes what the standard files cannot say (bf16-pure weights,
attention, selective checkpointing, Adam-mini, sequence length) from plan.json.

Verdict: the estimate at the job's configuration. When it does not fit, the cheapest changes
that make it fit (one change, else two, else the fastest fitting plans), each with its peak;
when it fits, faster plans that also fit. Exit codes: 0 fits, 1 will not fit, 2 bad input.
"""

from collections.abc import Callable
from functools import partial
from itertools import combinations
from pathlib import Path

from pydantic import ConfigDict, Field, ValidationError

from planner.catalog.files import read_mapping
from planner.catalog.models import resolve_model
from planner.check.job_files import JOB_DIR_ALSO, JOB_FILES, read_job
from planner.core.errors import PlannerInputError
from planner.core.formatting import gib
from planner.core.job import Reading
from planner.core.lengths import Batching
from planner.core.record import Record
from planner.core.vocabulary import MAX_BATCH, MAX_SEQ_LEN, PADDED_METHODS, SHAPE_FIELDS
from planner.engine.alternatives import faster_changes, memory_savers
from planner.engine.estimate import check_config, default_seq_len, estimate_config
from planner.engine.lengths_file import lengths_of
from planner.engine.search import search_plans
from planner.engine.space import SPLITS, build_space, padded_workload
from planner.schema.estimate import EstimateResult
from planner.schema.target import DataShape, Target
from planner.strategies import BY_FIELD, TECHNIQUES, PlanContext, TrainingConfig, approximation_note, ladder_key
from planner.strategies.loss import evaluation_logits_bytes
from planner.strategies.method import dpo, generation_batch_faults
from planner.strategies.request_fields import TechniqueChoices
from planner.strategies.sequence_parallel import pad_multiple

#: every technique and the workload, but what the batching and the samples' lengths derive
CONFIG_FIELDS = tuple(f for f in TrainingConfig.model_fields if f not in SHAPE_FIELDS)


class CheckRequest(Target, DataShape, TechniqueChoices):
    """The job's files (any subset, or a job directory) and flags that fill or override them: one
    optional value per technique (TechniqueChoices) and the workload."""

    # model None: the model the recipe names (model_name_or_path, base_model)
    accelerate_config: Path | None = None
    deepspeed_config: Path | None = None
    training_args: Path | None = None
    runtime_args: Path | None = None  # planner's runtime.json
    torchtitan_config: Path | None = None  # a torchtitan TOML (--job.config_file)
    job_dir: Path | None = None  # a directory of the files above (and plan.json), as `suggest --out` writes
    micro_batch_size: int | None = Field(None, ge=1, le=MAX_BATCH)
    grad_accum: int | None = Field(None, ge=1, le=MAX_BATCH)
    seq_len: int | None = Field(None, ge=1, le=MAX_SEQ_LEN)
    alternatives: int = Field(5, ge=0, le=50)  # how many changes / faster plans to list


class Change(Record):
    model_config = ConfigDict(extra="forbid", frozen=True)
    change: str  # "checkpointing none -> full"
    peak_bytes: int
    fits: bool
    tokens_per_second: float
    config: TrainingConfig


class CheckResult(Record):
    model_config = ConfigDict(extra="forbid", frozen=True)

    fits: bool
    estimate: EstimateResult
    model_source: str = "--model"  # where the model came from
    sources: dict[str, str]  # field -> where its value came from
    warnings: list[str]  # what the files say that the planner does not model
    changes: list[Change]  # when it does not fit: cheapest changes that make it fit
    faster: list[Change]  # when it fits: faster plans that also fit
    reasons: list[str]


def check(request: CheckRequest) -> CheckResult:
    hardware = request.hardware()
    reading, plan_config = _read_files(request, hardware)
    model, model_source = _model(request, reading)
    hardware = _server_split(request, reading, hardware)
    config, sources = _resolve(request, reading, plan_config, model, hardware)
    if refused := check_config(PlanContext(model, hardware, config)).unmodelled:
        raise PlannerInputError([f"the job as read: {x}" for x in refused],
                                hint="planner cannot give this job a verdict: it may run, but what it holds is not "
                                     "modelled yet. Check it with the change the reason names, or measure it.")
    result = estimate_config(model, hardware, config, request.margin)
    if reading.time_as:  # the job runs slower than its memory reading: time it as it runs
        timed = estimate_config(model, hardware, config.model_copy(update=reading.time_as), request.margin)
        result = result.model_copy(update={"time": timed.time})
    warnings = reading.warnings + result.warnings
    if reading.evaluation:
        warnings.append(_evaluation_warning(model, result, *reading.evaluation, sources.get("loss", "")))
    changes, faster = [], []
    lengths = lengths_of(request)
    if request.alternatives:
        keep = partial(_expressible, config, reading)
        if result.fits:
            faster = _faster_plans(model, hardware, config, request.margin, result, request.alternatives, lengths, keep)
        else:
            changes = _changes_that_fit(model, hardware, config, request.margin, result, request.alternatives, lengths,
                                        keep, _narrowed(config, reading))
        if reading.expressible:
            warnings.append(f"changes {reading.expressible_by} cannot express (DeepSpeed, adapters, other losses and "
                            "optimizers, ...) are not offered")
    return CheckResult(
        fits=result.fits, estimate=result, model_source=model_source, sources=sources,
        warnings=warnings,
        changes=changes, faster=faster, reasons=_reasons(result, changes, faster),
    )


def _expressible(config: TrainingConfig, reading: Reading, change: TrainingConfig) -> bool:
    """Whether the job's launcher can express ``change`` (``Reading.expressible``: every field it
    names kept as the job has it, or set to a value it can say)."""
    return all(getattr(change, k) == getattr(config, k) or getattr(change, k) in values
               for k, values in reading.expressible.items())


def _narrowed(config: TrainingConfig, reading: Reading) -> dict[str, list[str]]:
    """The techniques' values a search for this job may take (``build_space``'s ``fixed``): for each
    technique ``Reading.expressible`` names, the job's own value and those its launcher can say. The
    layout's splits are left to the search's default (a space holds one degree of each:
    planner/engine/space.py ``SPLITS``); ``_expressible`` still filters what it finds."""
    splits = {field for field, *_ in SPLITS}
    return {f: [str(v) for v in BY_FIELD[f].choices if v == getattr(config, f) or v in values]
            for f, values in reading.expressible.items() if f in BY_FIELD and f not in splits}


#: The ledger terms resident while the Trainer evaluates between optimizer steps (the gradients are
#: set to None after each step, the activations freed).
EVAL_RESIDENT = ("weights", "master_weights", "optimizer_states", "cuda_context", "communication_buffers")


def _evaluation_warning(model, result: EstimateResult, rows: int, where: str, loss_source: str) -> str:
    """What the job's evaluation holds at its loss, beside the model states, since planner does not
    plan evaluation passes (strategies/loss.py ``evaluation_logits_bytes``; TRL's chunked_nll, read
    from ``loss_type``, chunks in evaluation too)."""
    batch = f"{where}: evaluation is not planned; an eval micro-batch of {rows} x {result.config.seq_len:,} tokens"
    if result.config.loss == "chunked" and "loss_type" in loss_source:
        return f"{batch} goes through TRL's chunked loss, as training does (its layers' temporaries not counted)"
    if dpo(result.config):
        return (f"{where}: evaluation is not planned; an eval micro-batch of {rows} pairs ({2 * rows} sequences of up "
                f"to {result.config.seq_len:,} tokens) goes through TRL's fused log-probability head (no logits), as "
                "training does (its layers' temporaries and the reference forward not counted)")
    logits = evaluation_logits_bytes(model, result.config, rows)
    states = sum(result.memory.get(t, 0) for t in EVAL_RESIDENT)
    total, usable = logits + states, result.usable_bytes
    verdict = (f"{gib(total)} with the model states, over the {gib(usable)} usable: lower per_device_eval_batch_size"
               if total > usable else f"{gib(total)} with the model states, within the {gib(usable)} usable")
    full = " (Liger computes the full logits outside training)" if result.config.loss == "chunked" else ""
    return f"{batch} holds {gib(logits)} at its loss{full}, {verdict} (its layers' temporaries not counted)"


def _model(request: CheckRequest, reading: Reading):
    """The model: --model, else the one the recipe names (resolved offline, as --model is)."""
    named = reading.model
    if request.model is not None:
        return resolve_model(request.model), "--model" + (f" (the recipe names {named[0]})" if named and
                                                          named[0] != request.model else "")
    if named is None:
        raise PlannerInputError("no model: --model is not given and the files name none",
                                hint="Pass --model with a catalog id (`planner models`) or a config.json path.")
    try:
        return resolve_model(named[0]), named[1]
    except PlannerInputError as e:
        raise PlannerInputError([f"{named[1]}: {p}" for p in e.problems],
                                hint="Pass --model with a catalog id of the same architecture (`planner models`) "
                                     "or the model's config.json.") from None


def _read_files(request: CheckRequest, hardware) -> tuple[Reading, dict | None]:
    paths = {k: getattr(request, k) for k in (*JOB_FILES, "torchtitan_config")}
    plan_config = None
    if request.job_dir is not None:
        if not request.job_dir.is_dir():
            raise PlannerInputError(f"--job-dir {request.job_dir} is not a directory")
        if paths["torchtitan_config"] is None:
            paths["torchtitan_config"] = _torchtitan_in(request.job_dir)
        for key, name in JOB_FILES.items():
            found = [request.job_dir / n for n in (name, *JOB_DIR_ALSO.get(key, ())) if (request.job_dir / n).is_file()]
            if paths[key] is None and len(found) > 1:
                raise PlannerInputError(f"--job-dir {request.job_dir}: {' and '.join(f.name for f in found)} "
                                        "both hold one file's settings",
                                        hint=f"Pass the one the job uses with --{key.replace('_', '-')}.")
            if paths[key] is None and found:
                paths[key] = found[0]
        if paths["runtime_args"] is None:
            plan_config = _plan_config(request.job_dir / "plan.json")
    if not any(paths.values()) and request.job_dir is None:
        raise PlannerInputError("no job files given",
                                hint="Pass --accelerate-config, --deepspeed-config, --training-args, --runtime-args, "
                                     "--torchtitan-config or --job-dir.")
    return read_job(paths, method=str(request.method) if request.method is not None else None,
                    gpus=(hardware.num_gpus, hardware.gpus_per_node)), plan_config


def _torchtitan_in(folder: Path) -> Path | None:
    """The torchtitan TOML of a job folder (a pyproject.toml is not one), if it holds one."""
    from planner.check.torchtitan import is_torchtitan

    found = []
    for path in sorted(folder.glob("*.toml")):
        try:
            if path.is_file() and is_torchtitan(read_mapping(path, "TOML file")):
                found.append(path)
        except PlannerInputError:
            continue  # (not a job file: named only if passed with --torchtitan-config)
    if len(found) > 1:
        raise PlannerInputError(f"--job-dir {folder}: {' and '.join(f.name for f in found)} are both torchtitan configs",
                                hint="Pass the one the job runs with --torchtitan-config.")
    return found[0] if found else None


def _plan_config(path: Path) -> dict | None:
    if not path.is_file():
        return None
    from planner.emit import load_plan_file

    return load_plan_file(path).plans[0].config.model_dump(mode="json")


def _server_split(request: CheckRequest, reading: Reading, hardware):
    """A GRPO job with a vLLM server on one machine whose accelerate config runs fewer processes
    than --gpus has GPUs (open-r1's layout: ``--num_processes 7`` on 8, the eighth serving vLLM):
    training on the processes' GPUs, the rest the server's (``vllm_gpus``), unless --vllm-gpus
    says otherwise. Other jobs: ``hardware`` as given."""
    generation = reading.values.get("generation", (None, ""))[0]
    count, _, gpu = request.gpus.partition("x")
    if (str(generation) != "vllm-server" or reading.processes is None or hardware.nodes != 1
            or request.vllm_gpus is not None or not count.isdigit() or "x" in gpu):
        return hardware
    processes, where = reading.processes
    if not 0 < processes < hardware.num_gpus:
        return hardware
    reading.values["vllm_gpus"] = (hardware.num_gpus - processes, f"{where} = {processes} of --gpus {request.gpus}: "
                                   "the other GPUs serve vLLM")
    return request.hardware(f"{processes}x{gpu}")


def _generation_batch_problems(values: dict, sources: dict, num_gpus: int) -> list[str]:
    """What GRPOConfig.__post_init__ raises for a generation batch the files name: not whole
    micro-batches of every process, or not whole groups of ``num_generations``."""
    size, mbs, groups = (values.get(k) for k in ("generation_batch_size", "micro_batch_size", "num_generations"))
    if (str(values.get("method")) != "grpo" or not isinstance(size, int) or not isinstance(mbs, int)
            or not isinstance(groups, int) or size < 1 or mbs < 1 or groups < 1):
        return []
    where = sources.get("generation_batch_size", "generation_batch_size")
    words = {"micro-batches": f"micro-batch {mbs} x {num_gpus} GPUs: GRPOConfig raises (it must be divisible by the "
                              "global batch)",
             "groups": f"num_generations {groups}: GRPOConfig raises"}
    return [f"{where} = {size} is not a multiple of {words[fault]}"
            for fault in generation_batch_faults(size, mbs, num_gpus, groups)]


def _resolve(request, reading: Reading, plan_config, model, hardware) -> tuple[TrainingConfig, dict]:
    num_gpus, nodes = hardware.num_gpus, hardware.nodes
    problems = []
    # launchers override the file's counts (accelerate launch --num_processes / --num_machines, as
    # SLURM scripts do): --gpus is the job's shape, the file's count a note
    for count, what, given in ((reading.processes, "GPUs", num_gpus), (reading.machines, "node(s)", nodes)):
        if count and count[0] != given:
            reading.warnings.append(f"{count[1]} = {count[0]}, but --gpus {request.gpus} is {given} {what}: planned "
                                    f"for --gpus (a launcher's --num_processes / --num_machines overrides the file)")
    values = {k: v for k, (v, _) in reading.values.items()}
    sources = {k: where for k, (_, where) in reading.values.items()}
    for name in CONFIG_FIELDS:
        flag = getattr(request, name)
        if flag is not None:
            values[name], sources[name] = str(flag) if not isinstance(flag, int) else flag, f"--{name.replace('_', '-')}"
        elif name not in values and plan_config is not None:
            values[name], sources[name] = plan_config[name], "plan.json"
    for name, value in list(values.items()):  # a partial reading, made precise by the strategy with plan.json
        strategy = BY_FIELD.get(name)
        if strategy is not None and strategy.settle is not None:
            values[name], note = strategy.settle(value, plan_config[name] if plan_config else None)
            sources[name] += note
    defaults = {s.field: s.default_on(hardware) for s in TECHNIQUES} | {"seq_len": default_seq_len(model)}
    for name in CONFIG_FIELDS:
        if name not in values:
            values[name] = defaults.get(name, TrainingConfig.model_fields[name].default)
            sources[name] = "default"
    if sources["batching"] == "default" and request.lengths is not None:
        values["batching"], sources["batching"] = request.batching_used, "--lengths (samples one per sequence)"
    elif sources["batching"] == "default" and str(values.get("method")) in PADDED_METHODS:
        values["batching"], sources["batching"] = Batching.PADDED, f"method {values['method']}: its trainer pads"
    if values["batching"] in (Batching.PADDED, Batching.PADDED_MAX) and all(
            isinstance(values[k], int) and values[k] >= 1 for k in ("seq_len", "micro_batch_size")):
        cap = values["seq_len"]  # (rows of the samples' own lengths: core/lengths.py)
        values |= padded_workload(values["batching"], cap, lengths_of(request), values["micro_batch_size"],
                                  pad_multiple(values.get))
        if values["seq_len"] < cap:
            sources["seq_len"] += f" {cap}; the longest sample of --lengths is shorter"
    for s in TECHNIQUES:  # a technique's settings mean nothing while it is off (LoRA's rank without an adapter)
        for x in s.settings:
            if not s.uses_settings(values[s.field], x) and (sources[x.name] == "default" or x.used_at):
                sources[x.name] = f"unused ({s.field} {values[s.field]})"
    if reading.steps_per_generation and isinstance(values["micro_batch_size"], int):
        steps, where = reading.steps_per_generation
        values["generation_batch_size"] = steps * values["micro_batch_size"] * num_gpus
        sources["generation_batch_size"] = (f"{where} = {steps} x micro-batch {values['micro_batch_size']} x "
                                            f"{num_gpus} GPUs")
    problems += _generation_batch_problems(values, sources, num_gpus)
    try:
        config = TrainingConfig(**values)
    except ValidationError as e:
        problems += [f"{'.'.join(map(str, er['loc']))} ({sources.get(str(er['loc'][0]), '?')}): {er['msg']}"
                     for er in e.errors()]
    else:
        # DeepSpeed counts every rank's micro-batches, sequence-parallel ranks included: transformers
        # fills "auto" so and its ZeRO-3 init refuses another count (a Ulysses launch with the
        # replicas' count, GPUs / sp_size, dies there; with every rank's it runs:
        # tests/test_launch_live.py, checked by hand with 8 on two ranks)
        total = config.micro_batch_size * config.grad_accum * num_gpus
        if reading.train_batch and reading.train_batch[0] != total:
            problems.append(f"{reading.train_batch[1]} = {reading.train_batch[0]}, but micro-batch "
                            f"{config.micro_batch_size} x accumulation {config.grad_accum} x {num_gpus} GPUs = {total}"
                            + (" (DeepSpeed counts every rank's, sequence-parallel ones included)"
                               if config.sequence_shards > 1 else ""))
    if problems:
        raise PlannerInputError(problems, hint="The files, the flags and --gpus must describe the same job.")
    return config, sources


def describe(old: TrainingConfig, new: TrainingConfig) -> str:
    parts = []
    for name in CONFIG_FIELDS:
        a, b = getattr(old, name), getattr(new, name)
        if a != b:
            parts.append(f"{name.replace('_', '-')} {a} -> {b}")
    return ", ".join(parts)


def _change(old: TrainingConfig, r: EstimateResult, label: str | None = None) -> Change:
    """``label`` (already noting what it approximates), or the change described and noted."""
    label = label or describe(old, r.config) + approximation_note(r.config, old)
    return Change(change=label, peak_bytes=r.memory["peak"], fits=r.fits,
                  tokens_per_second=r.time.tokens_per_second, config=r.config)


def _one_field_fixes(model, hardware, config, margin) -> list[Change]:
    """Every single-field change (one technique to another value the search would try) that makes
    the job feasible and fit, in the ladder's order (``ladder_key``: exact first), fastest first:
    an infeasible job's fix is often one field (an optimizer the engine cannot run, an offload
    without its ZeRO stage)."""
    out = []
    for s in TECHNIQUES:
        if s.named:  # (the training method is the job's: never offered as a fix)
            continue
        old = getattr(config, s.field)
        for value in s.searched or tuple(s.enum):
            if value == old:
                continue
            r = estimate_config(model, hardware, config.model_copy(update={s.field: value}), margin)
            if r.feasible and r.fits:
                out.append(_change(config, r, f"{s.field} {old} -> {value}" + approximation_note(r.config, config)))
    return sorted(out, key=lambda c: (ladder_key(c.config, config), -c.tokens_per_second))


def _changes_that_fit(model, hardware, config, margin, result, limit, lengths=None,
                      keep: Callable[[TrainingConfig], bool] = lambda c: True,
                      narrowed: dict[str, list[str]] | None = None) -> list[Change]:
    """One change if any fits (the techniques' memory savers, or for an infeasible job any one
    field), else two, else the fastest fitting plans for this job's batch (``lengths``: the
    samples' token counts, which shape a padded micro-batch); only those ``keep`` takes (what the
    job's launcher can express), the plans searched within ``narrowed`` (``_narrowed``)."""
    savers = [a for a in (memory_savers(model, hardware, config, margin, baseline=result, lengths=lengths)
                          if result.feasible else []) if keep(a.result.config)]
    single = ([_change(config, a.result, a.change) for a in savers if a.result.fits] if result.feasible
              else [c for c in _one_field_fixes(model, hardware, config, margin) if keep(c.config)])
    if single:
        return single[:limit]
    pairs = []
    for a, b in combinations(savers, 2):
        merged = a.result.config.model_copy(update={k: getattr(b.result.config, k) for k in CONFIG_FIELDS
                                                    if getattr(b.result.config, k) != getattr(config, k)})
        r = estimate_config(model, hardware, merged, margin)
        if r.fits:
            pairs.append(_change(config, r, f"{a.change}; {b.change}"))
    pairs.sort(key=lambda c: (ladder_key(c.config, config), -c.tokens_per_second))
    return pairs[:limit] or [c for c in _plans(model, hardware, config, margin, limit, lengths, narrowed)
                             if keep(c.config)]


def _faster_plans(model, hardware, config, margin, result, limit, lengths=None,
                  keep: Callable[[TrainingConfig], bool] = lambda c: True) -> list[Change]:
    """Faster plans one technique and / or the micro-batch away from the job (a bounded search,
    planner/engine/alternatives.py ``faster_changes``; `planner suggest` searches the whole space),
    those ``keep`` takes."""
    return [_change(config, r) for r in faster_changes(model, hardware, config, margin, result, limit, lengths, keep)]


def _plans(model, hardware, config, margin, limit, lengths=None, fixed=None) -> list[Change]:
    """The fastest fitting plans with this job's sequence length, batching and global batch, the
    techniques narrowed to ``fixed``'s values (``build_space``)."""
    global_batch = config.sequences_per_step(hardware.num_gpus)
    try:
        space = build_space(hardware.num_gpus, config.seq_len, fixed, global_batch_size=global_batch,
                            batching=config.batching, lengths=lengths)
    except PlannerInputError:
        return []
    outcome = search_plans(space, model, hardware, margin)
    return [_change(config, estimate_config(model, hardware, outcome.config(r), margin)) for r in outcome.fitting[:limit]]


def _reasons(result: EstimateResult, changes: list[Change], faster: list[Change]) -> list[str]:
    reasons = list(result.reasons)
    for c in changes:
        reasons.append(f"{c.change}: {gib(result.memory['peak'])} -> {gib(c.peak_bytes)}, {c.tokens_per_second:,.0f} tokens/s")
    for c in faster:
        reasons.append(f"faster and fits: {c.change}: {c.tokens_per_second:,.0f} tokens/s "
                       f"(now {result.time.tokens_per_second:,.0f}), peak {gib(c.peak_bytes)}")
    return reasons
