"""Evaluate one fully specified configuration: the memory ledger, the step time, the verdict.

``evaluate`` is the fast core the search calls per candidate (plain drafts, no result objects);
``estimate_config`` builds the full, documented result from it; ``estimate(request)`` is what
``planner estimate`` runs.
"""

from dataclasses import dataclass, field
from operator import itemgetter

from planner.catalog.models import resolve_model
from planner.core.formatting import gib
from planner.core.ledger import (
    ALL_PHASES,
    PHASES,
    GpuPeaks,
    Ledger,
    LedgerDraft,
    Location,
    PagedInfo,
    Phase,
    peak_phase,
    phase_sum,
    terms_at,
)
from planner.core.lengths import Batching
from planner.core.specs import HardwareSpec, ModelSpec
from planner.core.timing import TimeDraft, assemble, assumed_share, step_seconds
from planner.core.vocabulary import DEFAULT_SEQ_LEN, SHAPE_FIELDS
from planner.cost import adapters, overheads, params
from planner.engine.assumptions import assumptions, rate_assumptions, rate_warning
from planner.engine.lengths_file import lengths_of
from planner.engine.ranking import TIE_BAND
from planner.engine.recorded import HookMemo, RowMemo
from planner.engine.space import padded_workload
from planner.schema.estimate import EstimateRequest, EstimateResult, HardwareInfo, ModelInfo
from planner.strategies import (
    REGISTRY,
    SETTINGS,
    TECHNIQUES,
    Check,
    Engine,
    PlanContext,
    PlanLayout,
    Strategy,
    TrainingConfig,
    reserve_extra,
)
from planner.strategies.adapter import whole_load_bytes
from planner.strategies.base import LAYOUT_INPUTS
from planner.strategies.rates import assumed_terms, peak_dtype, peak_flops
from planner.strategies.sequence_parallel import pad_multiple
from planner.strategies.sharding import Sharding, engine_of


@dataclass
class Evaluation:
    """What the search needs of one candidate, before any result object is built."""

    ctx: PlanContext
    check: Check
    usable: int
    draft: LedgerDraft | None = None  # None: infeasible, not evaluated further
    paged: PagedInfo | None = None
    peak: int = 0
    host: dict[str, int] | None = None
    time_draft: TimeDraft | None = None
    step_seconds: float = 0.0
    cut: bool = False  # stopped at its GPU peak floor, which does not fit (``evaluate``'s cut_misses)
    floor: int = 0  # that floor, bytes (cut_misses only): the GPU peak of its model states and CUDA context

    @property
    def feasible(self) -> bool:
        return not self.check.infeasible

    @property
    def ledger(self) -> LedgerDraft:
        """The memory ledger (a candidate skipped as infeasible has none)."""
        if self.draft is None:
            raise ValueError("an infeasible candidate skipped before its ledger was written")
        return self.draft

    @property
    def timing(self) -> TimeDraft:
        """The step-time ledger (a candidate skipped as infeasible has none)."""
        if self.time_draft is None:
            raise ValueError("an infeasible candidate skipped before its step time was written")
        return self.time_draft

    @property
    def host_memory(self) -> dict[str, int]:
        """Host RAM per node: peak, capacity and the usable share of it (a candidate skipped as
        infeasible has none)."""
        if self.host is None:
            raise ValueError("an infeasible candidate skipped before its host memory was written")
        return self.host

    @property
    def held(self) -> int:
        """The GPU peak less the paged optimizer state placed on the GPU (which fills whatever room
        the rest leaves: a plan fits the GPU when the rest does), bytes."""
        return self.peak - (self.paged.resident_bytes if self.paged else 0)

    @property
    def gpu_fits(self) -> bool:
        return self.peak <= self.usable

    @property
    def host_fits(self) -> bool:
        return self.host is not None and self.host["peak"] <= self.host["usable"]

    @property
    def fits(self) -> bool:
        return self.feasible and self.gpu_fits and self.host_fits

    @property
    def tokens_per_step(self) -> float:
        """The samples' own tokens in one optimizer step (padding not counted), all GPUs."""
        cfg = self.ctx.config
        return cfg.real_tokens_per_micro_batch * cfg.grad_accum * self.ctx.layout.data_parallel

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_per_step / self.step_seconds if self.step_seconds else 0.0

    @property
    def assumed_share(self) -> float:
        """The fraction of the step spent at rates planner assumes (planner/core/timing.py
        ``ASSUMED_RATE_TERMS``)."""
        if self.time_draft is None:
            return 0.0
        return assumed_share(self.time_draft, self.step_seconds, assumed_terms(self.ctx.hardware, self.ctx.engine))


def estimate(request: EstimateRequest) -> EstimateResult:
    model = resolve_model(request.model)
    hardware = request.hardware()
    config = resolve_config(request, model, hardware)
    result = estimate_config(model, hardware, config, request.margin)
    n, shards, tp = result.hardware.num_gpus, config.sequence_shards, config.tensor_shards
    replicas = (f"{n} GPUs" if shards * tp == 1 else
                f"{n // shards // tp} replica(s) of {shards * tp} GPUs ({'one sequence' if tp == 1 else 'its micro-batch'} each)")
    said = assumptions(request, hardware, config.seq_len, config.sequences_per_step(n),
                       seq_given=request.seq_len is not None, batch_given="micro_batch_size" in request.model_fields_set,
                       batch_words=f"micro-batch {config.micro_batch_size} x accum {config.grad_accum} x {replicas} = "
                                   + _step_tokens(config.real_tokens_per_micro_batch * config.grad_accum * n // tp,
                                                  config.real_seq_len is not None))
    said += rate_assumptions(hardware, result.time.terms, engine_of(config.sharding))
    return result.model_copy(update={"assumptions": said + [f"MFU of the {result.time.mfu_basis}"],
                                     "warnings": result.warnings + unused_settings(request, config)})


def unused_settings(request, config: TrainingConfig) -> list[str]:
    """A warning per setting the request names that its technique's value leaves unused (LoRA's
    rank without an adapter, --kbit-prep under lora): planned without it, and said."""
    out = []
    for s in TECHNIQUES:
        for x in s.settings:
            if getattr(request, x.name, None) is not None and not s.uses_settings(getattr(config, s.field), x):
                out.append(f"{x.flag} {getattr(request, x.name)} means nothing under {s.field} {getattr(config, s.field)}: "
                           "planned without it")
    return out


def _step_tokens(tokens: float, expected: bool) -> str:
    """A step's tokens in words: exact, or the expected real tokens of padded batches."""
    return f"~{tokens:,.0f} real tokens/step" if expected else f"{tokens:,.0f} tokens/step"


def resolve_config(request, model: ModelSpec, hardware: HardwareSpec) -> TrainingConfig:
    """The configuration a request names: each technique's value, or its default on this hardware;
    the sequence length, or the model's default."""
    fields = {s.field: getattr(request, s.field) or s.default_on(hardware) for s in TECHNIQUES}
    fields |= {x.name: getattr(request, x.name) for x in SETTINGS if getattr(request, x.name) is not None}
    fields |= {"micro_batch_size": request.micro_batch_size, "grad_accum": request.grad_accum}
    cap, batching = request.seq_len or default_seq_len(model, request), request.batching_used
    fields["seq_len"] = cap
    given = {k: getattr(request, k) for k in SHAPE_FIELDS}
    if batching != Batching.PACKED and any(v is not None for v in given.values()):
        fields |= {"batching": batching} | given  # a plan's own shape (its plan.json)
    elif batching != Batching.PACKED:  # rows of the samples' own lengths (planner/core/lengths.py)
        fields |= padded_workload(batching, cap, lengths_of(request), request.micro_batch_size, pad_multiple(fields.get))
    return TrainingConfig(**fields)


def default_seq_len(model: ModelSpec, request=None) -> int:
    """2048 tokens, or the model's learned-position limit where that is shorter (GPT-2: 1024).
    Where the ``request`` gives its samples' lengths and pads (``DataShape``): the longest
    sample (nothing truncated), within the model's positions."""
    lengths = lengths_of(request) if request is not None else None
    longest = lengths.longest if lengths is not None and request.batching_used != Batching.PACKED else None
    if model.learned_position_embeddings:
        return min(longest or DEFAULT_SEQ_LEN, model.max_position_embeddings)
    return longest or DEFAULT_SEQ_LEN


def check_config(ctx: PlanContext, first_only: bool = False) -> Check:
    """Every strategy's rules, then the workload's; ``first_only``: stop at the first refusal."""
    check = Check()
    for strategy in REGISTRY:
        strategy.check(ctx, check)
        if first_only and check.codes:
            return check
    check_workload(ctx, check)
    return check


#: The ledger row of the caching allocator's reserve as a fraction of the allocated peak (the
#: engines' stream pools are allocator_reserve rows too, written by their strategies).
FRAGMENTATION_LABEL = "caching-allocator fragmentation reserve"
#: The ledger rows that lift each phase to what a rank held while the model loaded whole
#: (strategies/adapter.py ``whole_load_bytes``), where that is more than the phase holds: the
#: allocator keeps the load's blocks cached, so the driver shows them through the run. Reserve
#: rows: the allocated reading planner reports is training's (``torch.cuda.max_memory_allocated``
#: reads the load's too unless its peak is reset after the load).
WHOLE_LOAD_LABEL = "the whole 4-bit base at load, kept in the allocator's cache"


#: The strategies whose rows are the model states (weights, master weights, gradients, optimizer
#: states): cheap to write, and most of a plan's memory when it does not fit.
FLOOR_WRITERS = tuple(s for s in REGISTRY if s.field in ("adapter", "precision", "optimizer"))
_OTHER_WRITERS = tuple(s for s in REGISTRY if s not in FLOOR_WRITERS)


#: The configuration fields a micro-batch size changes. No rule (``check_config``) and no layout
#: hook reads them (tests/test_search_dominance.py holds the hooks to it), so one check and one
#: layout serve every micro-batch size of a combination (``evaluate``'s ``shared``).
SIZE_FIELDS = frozenset({"micro_batch_size", "grad_accum", "tokens_per_micro_batch", "kernel_seq_len",
                         "attention_seq_len", "kernel_tokens_per_micro_batch", "attention_len",
                         "real_tokens_per_micro_batch"})


@dataclass
class Shared:
    """What the evaluations of one model on one hardware share (a search's, a probe scan's): each
    combination's check, by its fields but the micro-batch size's (``SIZE_FIELDS``),
    each layout, by the fields the layout hooks read (strategies.base ``LAYOUT_INPUTS``), and each
    strategy's ledger rows, by the values its ``apply`` hook read (planner/engine/recorded.py
    ``RowMemo``: most candidates share most of their rows with one seen before)."""

    checks: dict[tuple, Check] = field(default_factory=dict)
    layouts: dict[tuple, PlanLayout] = field(default_factory=dict)
    rows: dict[str, RowMemo] = field(default_factory=dict)
    pins: dict[str, HookMemo] = field(default_factory=dict)

    def write(self, strategy: Strategy, ctx: PlanContext, draft: LedgerDraft) -> None:
        """``strategy``'s rows for ``ctx`` into ``draft``: remembered, or written and remembered."""
        memo = self.rows.get(strategy.field)
        if memo is None:
            memo = self.rows[strategy.field] = RowMemo(strategy, ctx.model, ctx.hardware, self.layouts)
        draft.rows.extend(memo.rows(ctx.config))

    def pin(self, strategy: Strategy, ctx: PlanContext) -> dict:
        """``strategy.pin``'s settings for ``ctx``: remembered, or decided and remembered."""
        memo = self.pins.get(strategy.field)
        if memo is None:
            assert strategy.pin is not None
            memo = self.pins[strategy.field] = HookMemo(strategy.pin, ctx.model, ctx.hardware, self.layouts)
        return memo.answer(ctx.config)


_SIZE_FREE = itemgetter(*(f for f in TrainingConfig.model_fields if f not in SIZE_FIELDS))


#: The strategies that pin settings of a plan (``Strategy.pin``).
PINNING = tuple(s for s in REGISTRY if s.pin is not None)


def size_free_key(config: TrainingConfig) -> tuple:
    """``config``'s fields but the micro-batch size's (``SIZE_FIELDS``), in field order."""
    return _SIZE_FREE(config.__dict__)


def _context(model: ModelSpec, hardware: HardwareSpec, config: TrainingConfig, shared: Shared | None) -> PlanContext:
    """The plan context of ``config``, its layout the one ``shared`` holds for its ``LAYOUT_INPUTS``
    (resolved now, and kept there, when it holds none)."""
    ctx = PlanContext(model, hardware, config)
    if shared is not None:
        fields = config.__dict__
        layout_key = tuple(fields[f] for f in LAYOUT_INPUTS)
        if layout_key in shared.layouts:  # (a cached_property's value lives in the instance's __dict__)
            ctx.__dict__["layout"] = shared.layouts[layout_key]
        else:
            shared.layouts[layout_key] = ctx.layout
    return ctx


def evaluate(
    model: ModelSpec, hardware: HardwareSpec, config: TrainingConfig, margin: float = 0.0, *,
    skip_infeasible: bool = False, cut_misses: bool = False, cut_above: float = 0,
    shared: Shared | None = None, timed: bool = True,
) -> Evaluation:
    """``skip_infeasible``: checked up to the first refusal (its code is what a search reads), and
    a candidate a rule refuses is returned unevaluated. ``cut_misses``: one
    whose GPU peak floor (``FLOOR_WRITERS``' rows and the CUDA context: every other row only adds,
    rows being final as written) exceeds the usable memory, and ``cut_above`` bytes, is returned
    with that floor as its peak (``Evaluation.cut``: it does not fit the GPU, its peak and
    shortfall are at least the ones given); one that does not fit once its memory is written is
    returned without its step time (its memory exact, not ``cut``). ``shared``: the checks and
    layouts of the configurations evaluated so far for this model and hardware (``Shared``):
    reused, and added to. ``timed=False``: returned
    once its memory is written, without its step time (``time_evaluation`` adds it)."""
    ctx = _context(model, hardware, config, shared)
    for strategy in PINNING:  # the settings a strategy decides: the plan states them
        if strategy.pin is not None and (pinned := shared.pin(strategy, ctx) if shared else strategy.pin(ctx)):
            config = config.model_copy(update=pinned)
            ctx = _context(model, hardware, config, shared)
    if shared is None:
        check = check_config(ctx, first_only=skip_infeasible)
    else:
        key = size_free_key(config)
        known = shared.checks.get(key)
        check = known if known is not None else check_config(ctx, first_only=skip_infeasible)
        shared.checks[key] = check
    ev = Evaluation(ctx, check, int(hardware.gpu.memory_bytes * (1 - margin)))
    if skip_infeasible and not ev.feasible:
        return ev
    draft = LedgerDraft()
    context, base, measured = runtime_reserves(hardware)
    write = shared.write if shared is not None else _apply
    for strategy in FLOOR_WRITERS if cut_misses else REGISTRY:  # (the registry's order: the ledger's rows)
        write(strategy, ctx, draft)
    peaks, counted = GpuPeaks(), 0  # the rows walked so far: draft.rows[:counted]
    if cut_misses:
        counted = len(draft.rows)
        ev.floor = peaks.add(draft.rows).peaks[0] + context
        if ev.floor > max(ev.usable, cut_above):
            ev.peak, ev.cut = ev.floor, True
            return ev
        for strategy in _OTHER_WRITERS:
            write(strategy, ctx, draft)
    fragmentation = base + reserve_extra(config)
    draft.add("cuda_context", "CUDA context, driver reserve, cuBLAS workspace", context, 1,
              note="measured (planner calibrate)" if measured["context"] else "")
    if hardware.num_gpus > 1:
        draft.add("cuda_context", "NCCL buffers and communicators", overheads.nccl_bytes(hardware.gpu, hardware.nodes), 1,
                  note="channel buffers in host memory (no peer access: SHM transport)"
                  if overheads.nccl_shm(hardware.gpu, hardware.nodes) else "")
    peak, allocated = peaks.add(draft.rows[counted:]).peaks  # context, NCCL, stream pools: in every phase
    reserve = draft.add(
        "allocator_reserve", FRAGMENTATION_LABEL, allocated, fragmentation,
        note=f"{fragmentation:.1%} of the allocated peak" + (", measured" if measured["fragmentation"] else "")
        + (f" ({fragmentation - base:.0%} of it for the techniques' own pools)" if fragmentation > base else ""),
    )
    peak += reserve.bytes  # resident in every phase too
    if whole := whole_load_bytes(ctx):  # the load's blocks, kept in the allocator's cache: no phase holds less
        whole += context
        for phase in PHASES:
            if (lift := whole - phase_sum(draft.rows, phase, Location.GPU)) > 0:
                draft.add("allocator_reserve", WHOLE_LOAD_LABEL, lift, 1, phases=frozenset({phase}),
                          note="each GPU loads the whole 4-bit base before DeepSpeed partitions it")
        peak = max(peak, whole)
    ev.draft, ev.paged = draft, _place_paged_state(draft, ev.usable, peak)
    ev.peak = peak + (ev.paged.resident_bytes if ev.paged else 0)
    ev.host = _host_memory(ctx, draft, ev.paged)
    if (cut_misses and not (ev.gpu_fits and ev.host_fits)) or not timed:
        return ev  # a miss (or untimed): its memory is what the search reads
    return time_evaluation(ev)


def _apply(strategy: Strategy, ctx: PlanContext, draft: LedgerDraft) -> None:
    strategy.apply(ctx, draft)


def time_evaluation(ev: Evaluation) -> Evaluation:
    """``ev`` with its step time: every strategy's ``time`` hook over its memory ledger (an
    evaluation whose memory is written: ``evaluate``'s ``timed=False`` leaves a plan here)."""
    ctx, draft = ev.ctx, ev.ledger
    timing, layers, fused = TimeDraft(), ctx.model.num_layers, ctx.layout.fused_attention
    timing.dispatch(layers * overheads.layer_forward_dispatch_seconds(fused),
                    layers * overheads.layer_backward_dispatch_seconds(fused))
    for strategy in REGISTRY:
        strategy.time(ctx, draft, ev.paged, timing)
    ev.time_draft, ev.step_seconds = timing, step_seconds(timing, ctx.config.grad_accum)
    return ev


def runtime_reserves(hardware: HardwareSpec) -> tuple[int, float, dict[str, bool]]:
    """Bytes of CUDA context per GPU and the allocator's base reserve as a fraction of the
    allocated peak (techniques add their own: strategies ``reserve_extra``): fitted from measured
    probes on this GPU when the calibration store has them (GpuSpec.calibration), else
    planner/cost/overheads.py's."""
    cal = hardware.gpu.calibration
    context = cal.context_bytes if cal and cal.context_bytes is not None else overheads.cuda_context_bytes(hardware.gpu)
    fragmentation = (cal.fragmentation_fraction if cal and cal.fragmentation_fraction is not None
                     else overheads.FRAGMENTATION_FRACTION)
    measured = {"context": bool(cal and cal.context_bytes is not None),
                "fragmentation": bool(cal and cal.fragmentation_fraction is not None)}
    return context, fragmentation, measured


def estimate_config(model: ModelSpec, hardware: HardwareSpec, config: TrainingConfig, margin: float = 0.0) -> EstimateResult:
    ev = evaluate(model, hardware, config, margin)
    return result_of(ev, margin)


def result_of(ev: Evaluation, margin: float) -> EstimateResult:
    """The full, documented result of an evaluation."""
    ctx, draft = ev.ctx, ev.ledger
    hardware, config = ctx.hardware, ctx.config
    rollout = any(Phase.ROLLOUT in r.phases and r.phases is not ALL_PHASES for r in draft.rows)
    phase_peaks = {p: phase_sum(draft.rows, p, Location.GPU) for p in Phase if p != Phase.ROLLOUT or rollout}
    peak = peak_phase(draft.rows)
    memory = terms_at(draft.rows, peak) | {"peak": ev.peak}
    time = assemble(
        ev.timing, config.grad_accum, ev.tokens_per_step, ctx.world_size,
        # (useful FLOPs at the samples' mean length: attention's share at their own lengths, roughly;
        # the whole model's, whose tokens the job trains, under tensor parallelism too)
        adapters.training_flops_per_token(ctx.whole_model, config.real_seq_len or config.seq_len, ctx.layout.adapter),
        peak_flops(ctx), peak_dtype(ctx),
    )
    rated = rate_warning(time.terms, time.step_seconds, TIE_BAND, assumed_terms(hardware, ctx.engine))
    return EstimateResult(
        model=_model_info(ctx.whole_model, _trained(ctx)),
        hardware=HardwareInfo(
            gpu=hardware.gpu.id, gpu_name=hardware.gpu.name, num_gpus=hardware.num_gpus, nodes=hardware.nodes,
            gpus_per_node=hardware.gpus_per_node, gpu_memory_bytes=hardware.gpu.memory_bytes,
            host_memory_bytes_per_node=hardware.host_memory_bytes_per_node,
            inter_node_bytes_per_s=hardware.inter_node_bytes_per_s,
            page_migration_bytes_per_s=hardware.page_migration_bytes_per_s,
            cpu_optimizer_params_per_s=hardware.cpu_optimizer_params_per_s,
            calibration=hardware.gpu.calibration.note if hardware.gpu.calibration else None,
            gpu_file=hardware.gpu.file, gpu_definition=hardware.gpu.definition,
        ),
        config=config,
        memory=memory,
        peak_phase=peak,
        phase_peaks=phase_peaks,
        usable_bytes=ev.usable,
        headroom_bytes=ev.usable - ev.peak,
        host_memory=ev.host,
        paged=ev.paged,
        ledger=Ledger.from_draft(draft).rows,
        time=time,
        feasible=ev.feasible,
        fits=ev.fits,
        reasons=_reasons(ev.check, ev.peak, peak, ev.usable, margin, ev.host_memory, ev.paged),
        # how --gpus was read, where that needs saying; a fitting plan's speed that rests on an assumed rate
        warnings=ev.check.warnings + hardware.notes + ([rated] if ev.fits and rated else []),
    )


def check_workload(ctx: PlanContext, out: Check) -> None:
    m, s = ctx.model, ctx.config.seq_len
    if s > m.max_position_embeddings:
        if m.learned_position_embeddings:
            out.reject("seq_len beyond learned positions",
                       f"seq_len {s} exceeds {m.id}'s {m.max_position_embeddings} learned positions")
        else:
            out.warnings.append(f"seq_len {s} is beyond {m.id}'s max_position_embeddings ({m.max_position_embeddings})")


def _place_paged_state(draft: LedgerDraft, usable: int, gpu_peak: int) -> PagedInfo | None:
    """Unified-memory rows occupy what the GPU has left at its peak; the rest spills to host."""
    unified = [r for r in draft.rows if r.location == Location.UNIFIED]
    if not unified:
        return None
    draft.remove(unified)
    total = sum(r.bytes for r in unified)
    resident = max(0, min(total, usable - gpu_peak))
    label = unified[0].label
    draft.add("optimizer_states", f"{label}: resident on GPU", resident, 1, note="unified memory kept on the GPU")
    draft.add(
        "optimizer_states", f"{label}: spilled to host", total - resident, 1, location=Location.HOST,
        note="unified memory migrated to host RAM under pressure",
    )
    return PagedInfo(state_bytes=total, resident_bytes=resident, spilled_bytes=total - resident)


def _host_memory(ctx: PlanContext, draft: LedgerDraft, paged: PagedInfo | None) -> dict[str, int]:
    """Host RAM per node: per-rank host rows times ranks per node, the processes' own memory,
    and the model load: each process loads the checkpoint in its parameter dtype (an adapter's
    frozen base in its own), except under ZeRO-3 / FSDP where one process per node loads and the
    others start empty; a quantized base (QLoRA, LLM.int8()) is read a shard at a time and
    quantized as it moves to the GPU (planner/cost/adapters.py ``quantized_load_host_bytes``)."""
    gpn = ctx.hardware.gpus_per_node
    per_rank = draft.peak_bytes(Location.HOST)
    spilled = paged.spilled_bytes if paged else 0
    spec, kept = ctx.layout.adapter, 0
    if spec is not None and (spec.nf4 or spec.int8):
        loading, kept = adapters.quantized_load_host_bytes(ctx.model, spec, gpn, fsdp=ctx.engine == Engine.FSDP)
    else:
        loaders = 1 if ctx.engine == Engine.FSDP or ctx.config.sharding == Sharding.ZERO3 else gpn
        loading = loaders * params.total_parameters(ctx.model) * (ctx.layout.frozen_bytes or ctx.layout.weight_bytes)
    offloaded = (per_rank - spilled) * gpn
    runtime = overheads.HOST_PROCESS_BYTES * gpn
    return {
        "offloaded": offloaded,
        "paged_spill": spilled * gpn,
        "process_runtime": runtime,
        "model_loading": loading,
        "peak": runtime + max(loading, kept + offloaded + spilled * gpn),
        "capacity": ctx.hardware.host_memory_bytes_per_node,
        "usable": overheads.usable_host_bytes(ctx.hardware.host_memory_bytes_per_node),
    }


def _reasons(
    check: Check, peak: int, phase: Phase, usable: int, margin: float, host: dict[str, int], paged: PagedInfo | None
) -> list[str]:
    if check.infeasible:
        return list(check.infeasible)
    reasons = []
    kept = f" ({margin:.0%} margin kept free)" if margin else ""
    if peak > usable:
        reasons.append(
            f"GPU memory does not fit: needs {gib(peak)} per GPU at its {phase} peak, {gib(usable)} usable{kept}: "
            f"{gib(peak - usable)} short"
            + (f"; inside the GPU's {gib(total)}, only the margin for the model's error is missing (--margin "
               "0 risks an OOM)" if margin and peak <= (total := int(usable / (1 - margin))) else "")
        )
    elif paged and not paged.spilled_bytes:
        reasons.append(
            f"GPU memory fits: {gib(peak)} of {gib(usable)} per GPU{kept}, the paged optimizer state "
            f"({gib(paged.state_bytes)}) stays on the GPU"
        )
    elif paged:
        others = peak - paged.resident_bytes
        reasons.append(
            f"GPU memory fits: {gib(others)} of {gib(usable)} per GPU{kept} without the paged optimizer state, "
            f"which takes {gib(paged.resident_bytes)} of the rest and spills {gib(paged.spilled_bytes)} to host RAM"
        )
    else:
        reasons.append(f"GPU memory fits: {gib(peak)} of {gib(usable)} per GPU{kept}, {gib(usable - peak)} to spare")
    kept_host = f" ({overheads.HOST_RESERVE_FRACTION:.0%} of {gib(host['capacity'])} kept free)"
    if host["peak"] > host["usable"]:
        reasons.append(
            f"host RAM does not fit: needs {gib(host['peak'])} per node, {gib(host['usable'])} usable{kept_host}: "
            f"{gib(host['peak'] - host['usable'])} short (pass --host-memory-gb if the machine has more)"
        )
    else:
        reasons.append(f"host RAM fits: {gib(host['peak'])} of {gib(host['usable'])} usable per node{kept_host}")
    return reasons


def _trained(ctx: PlanContext) -> int:
    """The parameters the plan trains: the layout's, or under tensor parallelism (whose plans train
    the whole model: strategies/tensor_parallel.py) the whole model's, not a rank's share."""
    if ctx.whole_model is ctx.model:
        return ctx.layout.trainable_parameters
    return params.total_parameters(ctx.whole_model)


def _model_info(m: ModelSpec, trainable: int) -> ModelInfo:
    return ModelInfo(
        id=m.id, family=m.family, source=m.source, num_parameters=params.total_parameters(m), num_trainable_parameters=trainable,
        num_active_parameters=params.active_parameters(m), num_layers=m.num_layers, hidden_size=m.hidden_size,
        vocab_size=m.vocab_size,
    )


__all__ = ["EstimateRequest", "EstimateResult", "Evaluation", "estimate", "estimate_config", "evaluate"]
