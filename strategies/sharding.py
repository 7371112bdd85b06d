"""Data parallelism and sharding: DDP, DeepSpeed ZeRO 1-3, FSDP (full, grad-op, hybrid), FSDP2 or FSDP1.

What each mode divides by the sharding degree N (ZeRO paper, Rajbhandari et al. 2020, Sec. 5;
FSDP: Zhao et al. 2023 "PyTorch FSDP", and the FSDP2 fully_shard docs):
- ddp: nothing; DDP's reducer also allocates flat gradient buckets covering every parameter
  (gradient_as_bucket_view=False, the default): one more gradient-sized copy.
- zero1: master weights and optimizer states. zero2: also gradients. zero3: also weights, which
  are gathered one module at a time (plus the prefetch bucket).
- fsdp (full shard): everything, gathered per decoder layer (+1 prefetched, and the previous
  all-gather output FSDP2 holds until the next one) and the root unit (embeddings, final norm,
  head) for its forward, then again for backward: planner emits reshard_after_forward=True for
  every unit, the root included. fsdp-grad-op keeps every layer unsharded between forward and
  backward. fsdp-hybrid shards within a node and replicates across nodes.

FSDP1 (``fsdp_version`` 1, the FlatParameter ``FullyShardedDataParallel``) is modelled as FSDP2
but for two facts: each unit's parameters are one flat tensor padded to a multiple of the world
size, so every rank holds an even 1/N (FSDP2 gives rank 0 ceil(dim0 / N) rows of every tensor);
and its shards are plain tensors, which bitsandbytes' 8-bit and paged optimizers step (FSDP2's
DTensors they cannot: strategies/optimizer.py). Its gathers and frees per moment are taken to be
FSDP2's (not traced: the probes build FSDP2). Source: torch/distributed/fsdp/_flat_param.py
(``FlatParamHandle``: flatten, pad to a multiple of the world size, chunk).

DeepSpeed's bucket settings are the plan's (``ZERO_SETTINGS``): planner emits the Hugging Face
"auto" values (reduce_bucket_size = h*h, stage3_prefetch_bucket_size = 0.9*h*h,
stage3_param_persistence_threshold = 10*h, as accelerate and the Trainer fill "auto":
accelerate accelerator.py ``_prepare_deepspeed``, transformers integrations/deepspeed.py) and
stage3_max_live_parameters = 1e9; ``check`` reads a job's own, where a key it leaves out takes
DeepSpeed's default (runtime/zero/config.py: reduce_bucket_size 5e8, stage3_prefetch_bucket_size
5e7, stage3_param_persistence_threshold 1e5, stage3_max_live_parameters 1e9), as it does under
accelerate's inline DeepSpeed plugin, whose config has none of them. sub_group_size = 1e9 and
overlap_comm = true are assumed (overlap_comm's own default is false under ZeRO-1/2: one reduce
buffer, not two, and no overlap of the reduction).
"""

from dataclasses import dataclass
from enum import StrEnum
from functools import cache

from planner.core.emitted import EmitDraft
from planner.core.job import FsdpSettings, JobFiles, Reading
from planner.core.ledger import LedgerDraft, Location, PagedInfo, Phase, Placement
from planner.core.specs import HardwareSpec, ModelSpec
from planner.core.timing import TimeDraft, Window
from planner.core.vocabulary import Setting
from planner.cost import adapters, comms, overheads, params
from planner.strategies import rates
from planner.strategies.base import Check, Choice, Engine, PlanContext, Strategy
from planner.strategies.fsdp_memory import forward_gathered_elements, fsdp_rows, gathered_model_elements
from planner.strategies.precision import grads_in_forward


class Sharding(StrEnum):
    NONE = "none"
    DDP = "ddp"
    ZERO1 = "zero1"
    ZERO2 = "zero2"
    ZERO3 = "zero3"
    FSDP = "fsdp"  # full shard
    FSDP_GRAD_OP = "fsdp-grad-op"
    FSDP_HYBRID = "fsdp-hybrid"


ALL_MODEL_STATES = ("weights", "master_weights", "optimizer_states", "gradients")


class GradientSync(StrEnum):
    """When FSDP reduces the gradients of an accumulating step (the ``gradient_sync`` setting)."""

    MICRO_BATCH = "micro-batch"  # after every micro-batch: sharded gradients accumulate (sync_each_batch)
    STEP = "step"  # on the last micro-batch only: unsharded gradients accumulate until then (accelerate's default)


@dataclass(frozen=True)
class ShardingChoice(Choice):
    """One sharding value: the ``engine`` that owns the step, and the model-state terms it
    ``divides`` by the sharding degree (ZeRO paper, Sec. 5; FSDP divides all four)."""

    engine: Engine
    divides: tuple[str, ...]


#: Every sharding value. Replicas are the plain data parallelism; a sharding engine (DeepSpeed,
#: FSDP) weighs as two techniques (its own collectives, checkpoint format and wrapping), two-level
#: sharding as three.
CHOICES: dict[Sharding, ShardingChoice] = {
    Sharding.NONE: ShardingChoice("one process, one GPU", Engine.TORCH, ()),
    Sharding.DDP: ShardingChoice("DDP replicas: every rank holds every state", Engine.TORCH, ()),
    Sharding.ZERO1: ShardingChoice("DeepSpeed ZeRO-1: master weights and optimizer states sharded", Engine.DEEPSPEED,
                                   ("master_weights", "optimizer_states"), complexity=2),
    Sharding.ZERO2: ShardingChoice("DeepSpeed ZeRO-2: and gradients", Engine.DEEPSPEED,
                                   ("master_weights", "optimizer_states", "gradients"), complexity=2),
    Sharding.ZERO3: ShardingChoice("DeepSpeed ZeRO-3: and weights, gathered per module", Engine.DEEPSPEED,
                                   ALL_MODEL_STATES, complexity=2),
    Sharding.FSDP: ShardingChoice("FSDP full shard, gathered per decoder layer", Engine.FSDP, ALL_MODEL_STATES,
                                  complexity=2),
    Sharding.FSDP_GRAD_OP: ShardingChoice("FSDP keeping each layer unsharded from forward to backward", Engine.FSDP,
                                          ALL_MODEL_STATES, complexity=2),
    Sharding.FSDP_HYBRID: ShardingChoice("FSDP sharded within a node, replicated across nodes", Engine.FSDP,
                                         ALL_MODEL_STATES, complexity=3),
}
ZERO = tuple(s for s, c in CHOICES.items() if c.engine == Engine.DEEPSPEED)
FSDP = tuple(s for s, c in CHOICES.items() if c.engine == Engine.FSDP)


def engine_of(sharding: Sharding) -> Engine:
    return CHOICES[sharding].engine


def _parallelism(ctx: PlanContext) -> dict:
    """The engine, the data-parallel degree (the GPUs over the tensor-parallel degree: each group of
    ``tensor_shards`` shares its batch) and the sharding degree: the ranks sharing one copy of the
    sharded states, each rank's share of the model under tensor parallelism (fsdp-hybrid: a node's)."""
    s, t = ctx.config.sharding, ctx.tensor_shards
    n = max(1, ctx.world_size // t)  # (a degree of every GPU or more is refused: strategies/tensor_parallel.py)
    node = max(1, ctx.hardware.gpus_per_node // t)
    degree = 1 if s in (Sharding.NONE, Sharding.DDP) else node if s == Sharding.FSDP_HYBRID else n
    engine = engine_of(s)
    return {"engine": engine, "data_parallel": n, "shard_degree": degree,
            "gradients_sharded": engine == Engine.FSDP or s in (Sharding.ZERO2, Sharding.ZERO3),
            "resharding": engine == Engine.FSDP and s != Sharding.FSDP_GRAD_OP}


ZERO3_MAX_LIVE_PARAMETERS = 10**9
#: DDP's bucket_cap_mb default (25 MiB): one all-reduce call per bucket.
DDP_BUCKET_BYTES = 25 * 2**20
ZERO_SUB_GROUP_SIZE = 10**9
FWD, BWD, STEP = frozenset({Phase.FORWARD}), frozenset({Phase.BACKWARD}), frozenset({Phase.STEP})

#: DeepSpeed's own defaults (elements) for the bucket settings a config leaves out
#: (deepspeed runtime/zero/config.py, 0.19: reduce_bucket_size 5e8, prefetch_bucket_size 5e7,
#: param_persistence_threshold 1e5, max_live_parameters 1e9).
DEEPSPEED_DEFAULTS = {"reduce_bucket_size": 5 * 10**8, "stage3_prefetch_bucket_size": 5 * 10**7,
                      "stage3_param_persistence_threshold": 10**5, "stage3_max_live_parameters": 10**9}
#: DeepSpeed key -> the plan's setting (0: "auto", filled from the hidden size)
ZERO_KEYS = {"reduce_bucket_size": "zero_reduce_bucket_size", "stage3_prefetch_bucket_size": "zero_prefetch_bucket_size",
             "stage3_param_persistence_threshold": "zero_persistence_threshold",
             "stage3_max_live_parameters": "zero_max_live_parameters"}


def deepspeed_buckets(h: int, config=None) -> dict[str, int]:
    """The bucket sizes (elements) of a ZeRO plan with hidden size h: its settings, or where one
    is 0 ("auto"), the value accelerate and the Trainer fill in (``auto_buckets``)."""
    auto = auto_buckets(h)
    if config is None:
        return auto
    return {key: getattr(config, name) or auto[key] for key, name in ZERO_KEYS.items()}


def auto_buckets(h: int) -> dict[str, int]:
    """DeepSpeed's "auto" values as accelerate and the Trainer fill them for hidden size h."""
    return {"reduce_bucket_size": h * h, "stage3_prefetch_bucket_size": int(0.9 * h * h),
            "stage3_param_persistence_threshold": 10 * h, "stage3_max_live_parameters": ZERO3_MAX_LIVE_PARAMETERS}


def hybrid_possible(hardware) -> bool:
    """Whether ``hardware`` has nodes for hybrid sharding to replicate across (two or more)."""
    return hardware.nodes > 1


def _check(ctx: PlanContext, out: Check) -> None:
    s, n = ctx.config.sharding, ctx.world_size
    if s == Sharding.NONE and n > 1:
        out.reject("sharding none on several GPUs",
                   f"sharding none runs one process, but {n} GPUs were given; use ddp, zero1-3 or fsdp")
    if s == Sharding.DDP and n == 1:
        out.reject("ddp on one GPU", "ddp needs 2 or more GPUs; with one GPU use sharding none")
    if s in FSDP and ctx.config.fsdp_version == 1:
        out.warnings.append("FSDP1: deprecated by transformers 5 (FSDP2 is its default) and modelled as FSDP2 "
                            "but for its even flat shards; use it where an optimizer needs it (bitsandbytes')")
    if s == Sharding.FSDP_HYBRID and not hybrid_possible(ctx.hardware):
        out.reject("fsdp-hybrid on one node",
                   "fsdp-hybrid shards within a node and replicates across nodes: it needs 2+ nodes; use fsdp")
    if s not in (Sharding.NONE, Sharding.DDP) and n == 1 and ctx.config.offload == "none":  # (the offload strategy's "none")
        out.warnings.append(f"{s} on one GPU divides nothing; it only helps together with offload")


_UNSHARDED: dict[str, Placement] = {}


def _storage(ctx: PlanContext, decided: dict) -> dict:
    """How each model-state term's rows split across the ``shard_degree`` ranks: the terms the mode
    divides (``ShardingChoice.divides``). FSDP2 gives rank 0 its padded dim-0 chunks of the whole-model rows
    of uniform bytes per element (the frozen base's, the trained tensors'); any other row, and
    FSDP1's flat shards, an even 1/N (planner.core.ledger.Placement)."""
    s, m, n = ctx.config.sharding, ctx.model, decided["shard_degree"]
    if s in (Sharding.NONE, Sharding.DDP):
        return {"shards": _UNSHARDED}
    fsdp2 = engine_of(s) == Engine.FSDP and ctx.config.fsdp_version == 2
    chunks = _fsdp2_chunks(m, n, decided["adapter"], decided["trainable_parameters"]) if fsdp2 else ()
    return {"shards": _shards(s, n, chunks)}


@cache
def _shards(s: Sharding, n: int, chunks: tuple[tuple[int, int], ...]) -> dict[str, Placement]:
    """The placement of each term the mode divides (one shared, read-only dict per mode and degree)."""
    return {term: Placement(shard=n, chunks=chunks) for term in CHOICES[s].divides}


@cache
def _fsdp2_chunks(m: ModelSpec, n: int, adapter: adapters.AdapterSpec | None, trained: int) -> tuple[tuple[int, int], ...]:
    """FSDP2's whole tensor sets and rank 0's padded chunks of each: the frozen base (with an
    adapter) and the trained tensors."""
    base = ((params.total_parameters(m), params.fsdp_rank0_elements(m, n)),) if adapter is not None else ()
    return base + ((trained, params.fsdp_rank0_elements(m, n, adapters.trainable_tensors(m, adapter))),)


def _apply(ctx: PlanContext, ledger: LedgerDraft) -> None:
    s, m, lay = ctx.config.sharding, ctx.model, ctx.layout
    n = lay.shard_degree
    h = m.hidden_size
    if s == Sharding.DDP:
        ledger.add(
            "communication_buffers", "DDP gradient buckets", lay.trainable_parameters, lay.grad_bytes,
            note="reducer's flat buckets cover every gradient (gradient_as_bucket_view=False)",
        )
        return
    if ctx.engine == Engine.DEEPSPEED:
        _deepspeed_rows(ctx, ledger, n, h)
    elif ctx.engine == Engine.FSDP:
        fsdp_rows(ctx, ledger)
    _reduction_stream_pool(ctx, ledger, n)


def _reduction_stream_pool(ctx: PlanContext, ledger: LedgerDraft, n: int) -> None:
    """The caching allocator keeps a pool per CUDA stream: memory freed on one stream is not handed
    to another. The sharded gradients FSDP2's reduce-scatter writes (in the parameters' dtype) are
    allocated on its reduce-scatter stream, DeepSpeed ZeRO-1/2's reduced gradient partition on its
    reduction stream; once the step frees them (gradients set to None) their blocks stay reserved
    in that stream's pool while the next forward and backward allocate activations on the default
    stream. Bytes per GPU: the trained parameters' shard, in the forward phase (from the backward
    on the gradients are allocated in those very blocks, and their rows count them). Where
    DeepSpeed's gradients are resident in the forward phase (accumulating over micro-batches,
    ZeRO-3) the pool's blocks are theirs: no row. FSDP accumulating keeps both rows: reducing once
    per step it frees its sharded gradients at every step as without accumulation (as one rank of
    8 with 2 micro-batches reserved less allocated was 2.27 GiB, as without: run 9); reducing every
    micro-batch, each micro-batch's new shard is written on that stream, added into the
    accumulated one and freed (inferred, not measured).

    Measured on an H100 (Llama-3.2-1B, 2 x 2048, one rank; benchmarks/results/H100-SXM-80/2026-11-26):
    reserved less allocated peak was 5.74 GiB under FSDP2 and 5.39 GiB under ZeRO-2 against 1.0-1.4
    GiB for the same plans without an engine; the fp32 gradient shard is 4.60 GiB, ZeRO-2's is
    counted at fp32 too (its 16-bit partition, 2.30 GiB, alone falls short of what was measured).
    ZeRO-3 (its partition is built with the engine, on the default stream) reserved no more than
    plain plans. The rank of one's 5.74 GiB are its shard and the loss's logits hole (0.98 GiB,
    strategies/loss.py) to 0.03 GiB. As one rank of 8 (FSDP2, a fake process group; runs 2, 6 and
    7) reserved less allocated was 2.27 GiB: the shards (0.58 GiB), the logits hole (0.98), the
    base reserve (0.08) and 0.64 more, modelled as the largest unit's reduce-scatter input in the
    reduce dtype (the root: tied embeddings, 0.98 GiB in fp32: 0.34 GiB on the safe side), which a
    rank of one does not copy out. With the optimizer offloaded the pools hold other tensors:
    ``_offload_stream_pool``."""
    lay, c = ctx.layout, ctx.config
    if c.offload != "none" and lay.trainable_parameters:
        _offload_stream_pool(ctx, ledger, n)
        return
    if not lay.trainable_parameters:
        return
    shard = -(-lay.trainable_parameters // n)
    if ctx.engine == Engine.FSDP:
        ledger.add("allocator_reserve", "reduce-scatter stream's pool: the gradient shards it wrote", shard,
                   lay.grad_bytes, phases=FWD, note="freed blocks stay in that stream's pool (caching allocator)")
        if n > 1:  # one rank of several: the unit's input is copied into its own buffer first
            ledger.add("allocator_reserve", "reduce-scatter stream's pool: the largest unit's input", max(
                lay.root_trained, lay.layer_trained), lay.reduce_bytes, phases=FWD, note="measured as one rank of 8")
    elif ctx.engine == Engine.DEEPSPEED and Phase.FORWARD not in grads_in_forward(ctx):
        ledger.add("allocator_reserve", "reduction stream's pool: the gradient partition", shard, 4,
                   phases=FWD, note="freed blocks stay in that stream's pool (caching allocator)")


def _offload_stream_pool(ctx: PlanContext, ledger: LedgerDraft, n: int) -> None:
    """The side streams' pools of a plan whose optimizer steps on the host: blocks its engine
    allocates on a copy or reduction stream and frees stay reserved in that stream's pool (the
    caching allocator keeps a pool per stream), beyond the base fraction, in forward and backward,
    with or without accumulation (each micro-batch's gradients leave for the host).

    Measured on an H100 (Llama-3.2-1B, 2 x 2048, one rank; benchmarks/results/H100-SXM-80/
    2026-11-26-run7 and -run8, identical twice): reserved less allocated peak 3.03 GiB under
    DeepSpeed ZeRO-1 with offload_optimizer, 1.95 GiB beyond the loss's logits hole (0.98 GiB,
    strategies/loss.py) and the base reserve, modelled as the 16-bit gradient partition (2.30 GiB;
    DeepSpeed reduces on its reduction stream and copies each gradient there to the host's fp32
    partition); under FSDP2's CPUOffloadPolicy 2.14 GiB, 1.08 beyond the hole and the base,
    modelled as the host shards FSDP copies in and the gradients it copies out on its side
    streams: the root unit's and two layers' elements in the host weights' dtype (1.43 GiB).
    ZeRO-3 with offload_optimizer (run 9): reserved less allocated 3.41 GiB, 2.35 beyond the hole
    and the base, modelled as ZeRO-1's row. One plan each: the mechanism is inferred from the
    sizes, within 0.35 GiB and on the safe side. With the parameters offloaded too the GPU never holds its 16-bit partition, whose
    gradients it could not pool either: no row (not measured)."""
    lay = ctx.layout
    if ctx.engine == Engine.DEEPSPEED and "weights" not in lay.host_terms:
        shard = -(-lay.trainable_parameters // n)
        ledger.add("allocator_reserve", "reduction stream's pool: the 16-bit gradient partition (offload)", shard,
                   lay.grad_bytes, phases=FWD | BWD, note="measured under ZeRO-1 and ZeRO-3 offload (H100)")
    elif ctx.engine == Engine.FSDP:
        units = params.root_parameters(ctx.model) + 2 * lay.layer_gathered
        ledger.add("allocator_reserve", "FSDP side streams' pools: the root's and two layers' host shards (offload)",
                   -(-units // n), lay.frozen_bytes if lay.adapter else lay.weight_bytes, phases=FWD | BWD,
                   note="measured under FSDP2 CPU offload (H100)")


def _deepspeed_rows(ctx: PlanContext, ledger: LedgerDraft, n: int, h: int) -> None:
    """DeepSpeed's buffers: reduce buckets, the fp32 gradient partition of the trained
    parameters, ZeRO-3's persistent small parameters (the adapters' too) and gathers."""
    m, lay, s = ctx.model, ctx.layout, ctx.config.sharding
    b = deepspeed_buckets(h, ctx.config)
    ledger.add(
        "communication_buffers", "ZeRO reduce buckets (x2, overlap_comm)", 2 * b["reduce_bucket_size"], lay.grad_bytes,
        note=f"reduce_bucket_size {b['reduce_bucket_size']:,}",
    )
    trained = lay.trainable_parameters
    if lay.gradients_in_host_partition:  # ZeRO-Offload: the whole partition, in pinned host memory
        ledger.add("optimizer_step_temporaries", "fp32 gradient partition", -(-params.total_parameters(m) // n), 4,
                   location=Location.HOST, note="16-bit gradient partition upcast for the optimizer")
    else:  # one sub-group's upcast, for the step
        fp32_partition = min(-(-trained // n), ZERO_SUB_GROUP_SIZE) if s == Sharding.ZERO3 else -(-trained // n)
        ledger.add("optimizer_step_temporaries", "fp32 gradient partition for the step", fp32_partition, 4,
                   phases=STEP, note="16-bit gradient partition upcast for the optimizer")
    if s != Sharding.ZERO3:
        return
    threshold = b["stage3_param_persistence_threshold"]
    tensors = params.model_tensors(m) + (adapters.trainable_tensors(m, lay.adapter) if lay.adapter else ())
    persistent = sum(t.numel * params.multiplicity(m, t) for t in tensors if t.numel <= threshold)
    ledger.add(
        "weights", "ZeRO-3 persistent small parameters (unpartitioned)", persistent * (n - 1) / n, lay.weight_bytes,
        place=lay.placement("weights").replicated,
        note=f"tensors <= stage3_param_persistence_threshold ({threshold:,} elements)",
    )
    prefetch = b["stage3_prefetch_bucket_size"]
    live = b["stage3_max_live_parameters"]
    ledger.add(
        "gathered_parameters", "ZeRO-3 gathered head + prefetch", zero3_forward_gathered(ctx), lay.gathered_bytes,
        phases=FWD, note=f"the output head is gathered at the loss; prefetch bucket {prefetch:,}",
    )
    ledger.add(
        "gathered_parameters", "ZeRO-3 gathered layer + prefetch (backward)", min(live, lay.layer_gathered + prefetch),
        lay.gathered_bytes, phases=BWD, note="one decoder layer and the prefetch bucket",
    )
    ledger.add("gathered_parameters", "ZeRO-3 unpartitioned layer gradients", lay.layer_trained, lay.grad_bytes,
               phases=BWD)


def sharded_parameters(ctx: PlanContext) -> bool:
    """Whether the plan's parameters are partitioned (ZeRO-3, FSDP): a forward gathers them."""
    return ctx.config.sharding == Sharding.ZERO3 or ctx.engine == Engine.FSDP


def zero3_forward_gathered(ctx: PlanContext) -> int:
    """Elements a ZeRO-3 forward holds gathered at its peak: the output head at the loss and the
    prefetch bucket, at most ``stage3_max_live_parameters``. Unit: elements (of gathered_bytes)."""
    b = deepspeed_buckets(ctx.model.hidden_size, ctx.config)
    return min(b["stage3_max_live_parameters"], ctx.model.vocab_rows * ctx.model.hidden_size
               + b["stage3_prefetch_bucket_size"])


def forward_gathered(ctx: PlanContext) -> int:
    """Elements a forward of the partitioned model holds gathered at its peak (ZeRO-3:
    ``zero3_forward_gathered``; FSDP2: ``fsdp_memory.forward_gathered_elements``); 0 unpartitioned."""
    if ctx.config.sharding == Sharding.ZERO3:
        return zero3_forward_gathered(ctx)
    return forward_gathered_elements(ctx) if ctx.engine == Engine.FSDP else 0


def model_gather_seconds(ctx: PlanContext) -> float:
    """Seconds of one all-gather of every parameter (a forward's, unit by unit) over the slowest
    link its group spans: ZeRO-3's over the data-parallel GPUs, FSDP's over its shard group (a
    node's under fsdp-hybrid). Unit: seconds (0 unpartitioned or on one GPU)."""
    lay, hw = ctx.layout, ctx.hardware
    if lay.data_parallel == 1 or not sharded_parameters(ctx):
        return 0.0
    world = rates.link(ctx, hw.nodes > 1)
    if ctx.config.sharding == Sharding.ZERO3:
        volume = comms.all_gather_bytes(gathered_model_elements(ctx) * lay.weight_bytes, lay.data_parallel)
        return rates.collective_seconds(volume, world, ctx.model.num_layers)
    hybrid = ctx.config.sharding == Sharding.FSDP_HYBRID
    ranks = hw.gpus_per_node if hybrid else lay.data_parallel
    volume = comms.all_gather_bytes(gathered_model_elements(ctx) * lay.gathered_bytes, ranks)
    return rates.collective_seconds(volume, rates.link(ctx, False) if hybrid else world, ctx.model.num_layers + 1)


def _time(ctx: PlanContext, ledger: LedgerDraft, paged: PagedInfo | None, draft: TimeDraft) -> None:
    """Collective volumes per rank (ring algorithms, planner.cost.comms) over the slowest link
    the group spans, hidden under the compute of the pass that issues them (bucketed DDP
    all-reduce and ZeRO-2 reduce-scatter under backward; ZeRO-3 / FSDP prefetched all-gathers
    under forward and backward). End-of-step collectives (ZeRO-1 reduce, ZeRO-1/2 parameter
    all-gather) run alone."""
    s, m, lay, hw = ctx.config.sharding, ctx.model, ctx.layout, ctx.hardware
    n, layers = lay.data_parallel, m.num_layers
    trained = lay.trainable_parameters  # (every parameter is gathered; only the trained are reduced)
    gathered = gathered_model_elements(ctx)
    if ctx.engine == Engine.DEEPSPEED:
        per_layer = overheads.ZERO3_HOOK_SECONDS_PER_LAYER if s == Sharding.ZERO3 else overheads.ZERO12_HOOK_SECONDS_PER_LAYER
        draft.dispatch(layers * per_layer / 2, layers * per_layer / 2,
                       f"DeepSpeed's hooks ({per_layer * 1e3:.1f} ms a layer, measured: H100, 16-CPU host)")
    elif ctx.engine == Engine.FSDP:
        hooks = layers * overheads.FSDP_HOOK_SECONDS_PER_LAYER
        draft.dispatch(hooks / 2, hooks / 2)  # (forward and backward hooks alike)
        if ctx.fsdp2:
            _fsdp2_copies(ctx, draft, gathered, trained)
    if s == Sharding.NONE or n == 1:
        return
    world = rates.link(ctx, hw.nodes > 1)
    if s == Sharding.DDP:
        buckets = max(1, int(trained * lay.grad_bytes // DDP_BUCKET_BYTES))
        volume = comms.all_reduce_bytes(trained * lay.grad_bytes, n)
        draft.overlapped("communication", "DDP gradient all-reduce", rates.collective_seconds(volume, world, buckets),
                         Window.BACKWARD, per_micro_batch=False, note="once per step, bucketed under the last backward")
        return
    if ctx.engine == Engine.DEEPSPEED:
        gather = model_gather_seconds(ctx)
        reduce = rates.collective_seconds(comms.all_gather_bytes(trained * lay.grad_bytes, n), world, layers)
        if s == Sharding.ZERO3:
            draft.overlapped("communication", "ZeRO-3 parameter all-gather (forward)", gather, Window.FORWARD, True)
            draft.overlapped("communication", "ZeRO-3 all-gather + gradient reduce-scatter (backward)", gather + reduce,
                             Window.BACKWARD, True)
            return
        if s == Sharding.ZERO2:
            draft.overlapped("communication", "ZeRO-2 gradient reduce-scatter", reduce, Window.BACKWARD, True,
                             note="overlap_comm, every micro-batch")
        else:
            draft.serial("communication", "ZeRO-1 gradient reduce-scatter at the step", reduce)
        updated = rates.collective_seconds(comms.all_gather_bytes(trained * lay.weight_bytes, n), world, layers)
        draft.serial("communication", "updated 16-bit parameter all-gather", updated)
        return
    # FSDP2: all-gather params in param_dtype, reduce-scatter grads in reduce_dtype
    reduce_bytes = lay.reduce_bytes
    group = rates.link(ctx, False) if s == Sharding.FSDP_HYBRID else world
    ranks = hw.gpus_per_node if s == Sharding.FSDP_HYBRID else n
    gather = model_gather_seconds(ctx)
    reduce = rates.collective_seconds(comms.all_gather_bytes(trained * reduce_bytes, ranks), group, layers + 1)
    draft.overlapped("communication", "FSDP parameter all-gather (forward)", gather, Window.FORWARD, True)
    each = not ctx.fsdp_defers_reduction  # accumulating, the gradients are reduced on the last micro-batch only
    if each:
        backward = reduce if s == Sharding.FSDP_GRAD_OP else gather + reduce
        draft.overlapped("communication", "FSDP all-gather + reduce-scatter (backward)", backward, Window.BACKWARD, True)
    else:
        if s != Sharding.FSDP_GRAD_OP:
            draft.overlapped("communication", "FSDP parameter all-gather (backward)", gather, Window.BACKWARD, True)
        draft.overlapped("communication", "FSDP gradient reduce-scatter (last micro-batch)", reduce, Window.BACKWARD,
                         False, note="gradient sync off until the accumulation boundary")
    if s == Sharding.FSDP_HYBRID:
        across = comms.all_reduce_bytes(trained / ranks * reduce_bytes, hw.nodes)
        draft.overlapped("communication", "HSDP gradient all-reduce across nodes",
                         rates.collective_seconds(across, world, layers + 1), Window.BACKWARD, each)


def _fsdp2_copies(ctx: PlanContext, draft: TimeDraft, gathered: int, trained: int) -> None:
    """FSDP2's own memory traffic around its collectives, on each rank, at any world size (one
    too): memory bound, seconds = bytes / achieved bandwidth.
    - Each all-gather (forward; backward again where units reshard after forward): the rank's
      shard cast to param_dtype where it is stored wider (read w, write g per shard element, w
      the trained parameters' bytes and the frozen base's where an adapter trains; an adapter's
      NF4 codes are gathered as stored: ``FSDPParam.all_gather_inputs``), copied into the all-gather input (read g, write g:
      ``all_gather_copy_in``), and the whole gathered output copied out into the unsharded
      parameters (read g, write g per gathered element: ``split_with_sizes_copy``).
    - Each reduce-scatter (every micro-batch, or once a step where gradient sync waits for the
      last): the unsharded gradients copied into the reduce-scatter input in reduce_dtype (read g,
      write r per trained element: ``foreach_reduce_scatter_copy_in``); on one rank the output is
      a copy of that input (read r, write r).
    Source: torch distributed/fsdp/_fully_shard (_fsdp_param.py, _fsdp_collectives.py
    ``foreach_all_gather``, ``foreach_all_gather_copy_out``, ``foreach_reduce``). Measured on an
    H100 (Llama-3.2-1B, FSDP2 on one rank, 2 x 2048, bf16 params over fp32 shards): 0.137 s a step
    against 0.119 s planned without this traffic; with it 0.138 s (19 ms: derived, not fitted)."""
    lay = ctx.layout
    n, g, r = lay.shard_degree, lay.gathered_bytes, lay.reduce_bytes

    def cast(stored: int) -> int:
        return stored + g if stored != g else 0

    frozen = gathered - trained
    casts = trained * cast(lay.weight_bytes) + (frozen * cast(lay.frozen_bytes) if frozen else 0)
    gather = (casts / n + gathered * (2 * g / n + 2 * g)) / rates.bandwidth(ctx)
    reduce = trained * (g + r + (2 * r if n == 1 else 0)) / rates.bandwidth(ctx)
    draft.compute("elementwise", "FSDP2 all-gather copy-in and copy-out, casts (forward)", gather, Window.FORWARD)
    backward = gather if lay.resharding else 0.0
    if ctx.fsdp_defers_reduction:
        draft.serial("elementwise", "FSDP2 reduce-scatter copy-in (last micro-batch)", reduce)
    else:
        backward += reduce
    draft.compute("elementwise", "FSDP2 " + ("all-gather and " if lay.resharding else "")
                  + "reduce-scatter copies (backward)", backward, Window.BACKWARD)


def _emit(ctx: PlanContext, files: EmitDraft) -> None:
    """distributed_type; the ZeRO block of the DeepSpeed JSON (the bucket sizes the memory model
    assumes); the FSDP block (``_emit_fsdp``)."""
    s, m, hw = ctx.config.sharding, ctx.model, ctx.hardware
    acc, args = files.accelerate, files.training_args
    if s == Sharding.NONE:
        acc["distributed_type"] = "NO"
    elif s == Sharding.DDP:
        acc["distributed_type"] = "MULTI_GPU"
        args["ddp_find_unused_parameters"] = False
    elif ctx.engine == Engine.DEEPSPEED:
        stage = {Sharding.ZERO1: 1, Sharding.ZERO2: 2, Sharding.ZERO3: 3}[s]
        b, c = deepspeed_buckets(m.hidden_size, ctx.config), ctx.config
        # a bucket left to "auto" is written "auto": accelerate and the Trainer fill it from the
        # model's hidden size (``auto_buckets``), and check reads it back as the plan's setting
        zero = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True,
                "reduce_bucket_size": c.zero_reduce_bucket_size or "auto",
                "allgather_bucket_size": b["reduce_bucket_size"]}
        if stage == 3:
            del zero["allgather_bucket_size"]
            zero |= {
                "stage3_prefetch_bucket_size": c.zero_prefetch_bucket_size or "auto",
                "stage3_param_persistence_threshold": c.zero_persistence_threshold or "auto",
                "stage3_max_live_parameters": b["stage3_max_live_parameters"],
                "stage3_max_reuse_distance": b["stage3_max_live_parameters"],
                "sub_group_size": ZERO_SUB_GROUP_SIZE,
                "stage3_gather_16bit_weights_on_model_save": True,
            }
        files.deepspeed_config()["zero_optimization"] = zero
        files.extras.add("deepspeed")
        acc["distributed_type"] = "DEEPSPEED"
        acc["deepspeed_config"] = {"deepspeed_config_file": "deepspeed_config.json", "zero3_init_flag": stage == 3}
        if hw.nodes > 1:
            acc["deepspeed_config"]["deepspeed_multinode_launcher"] = "standard"
        args["deepspeed"] = "deepspeed_config.json"
    else:
        if ctx.config.tensor_shards > 1:
            # transformers' DistributedConfig applies FSDP2 at load time (strategies/tensor_parallel.py):
            # accelerate runs the processes and wraps nothing
            acc["distributed_type"] = "MULTI_GPU"
        else:
            _emit_fsdp(ctx, files)
        # the Trainer's key for accelerate's GradientAccumulationPlugin, which it honours for a model
        # sharded at load time too (what check reads back; without accumulation it changes nothing)
        sync = ctx.config.gradient_sync == GradientSync.MICRO_BATCH
        args["accelerator_config"] = {"gradient_accumulation_kwargs": {"sync_each_batch": sync}}


#: FSDP1's ShardingStrategy for each FSDP mode (HYBRID_SHARD: shard within a node, replicate across).
FSDP1_STRATEGIES = {Sharding.FSDP: "FULL_SHARD", Sharding.FSDP_GRAD_OP: "SHARD_GRAD_OP",
                    Sharding.FSDP_HYBRID: "HYBRID_SHARD"}


def _emit_fsdp(ctx: PlanContext, files: EmitDraft) -> None:
    """The FSDP block of both files (accelerate's keys carry its ``fsdp_`` prefix): wrap the family's
    decoder layer, sharded state dict, rank-0 loading. FSDP2: reshard after forward unless grad-op,
    hybrid through accelerate's parallelism_config (replicate across nodes, shard within). FSDP1:
    the mode's ShardingStrategy, prefetch of the next unit in backward (BACKWARD_PRE, its default),
    original parameters exposed (``use_orig_params``), rank-0 weights broadcast
    (``sync_module_states``, which accelerate requires with rank-0 loading)."""
    s, m, hw = ctx.config.sharding, ctx.model, ctx.hardware
    files.accelerate["distributed_type"] = "FSDP"
    both = {"state_dict_type": "SHARDED_STATE_DICT", "cpu_ram_efficient_loading": True}
    if ctx.fsdp2:
        reshard = s != Sharding.FSDP_GRAD_OP
        own = {"version": 2, "reshard_after_forward": reshard}
        if s == Sharding.FSDP_HYBRID:
            files.accelerate["parallelism_config"] = {
                "parallelism_config_dp_replicate_size": hw.nodes,
                "parallelism_config_dp_shard_size": hw.gpus_per_node,
            }
            files.notes.append("fsdp-hybrid: accelerate's parallelism_config replicates across nodes and shards within each")
    else:
        own = {"version": 1, "backward_prefetch": "BACKWARD_PRE", "forward_prefetch": False,
               "use_orig_params": True, "sync_module_states": True}
    accelerate = both | own | {"auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "transformer_layer_cls_to_wrap":
                               m.decoder_layer_class, "offload_params": False, "activation_checkpointing": False}
    # FSDP1's strategy: accelerate's launcher exports fsdp_sharding_strategy (FSDP_SHARDING_STRATEGY,
    # default FULL_SHARD), which its plugin prefers to reshard_after_forward; transformers 5 reads
    # only reshard_after_forward from fsdp_config. Each file in its reader's key.
    strategy1 = {} if ctx.fsdp2 else {"sharding_strategy": FSDP1_STRATEGIES[s]}
    trainer1 = {} if ctx.fsdp2 else {"reshard_after_forward": FSDP1_STRATEGIES[s]}
    files.fsdp().update({f"fsdp_{k}": v for k, v in (accelerate | strategy1).items()})
    # fsdp=True with everything in fsdp_config: transformers 5 deprecates the option string
    # ("full_shard auto_wrap") for removal
    files.training_args["fsdp"] = True
    files.trainer_fsdp().update(both | own | trainer1 | {"transformer_layer_cls_to_wrap": [m.decoder_layer_class]})


#: accelerate's distributed_type -> vocabulary (NO is none on one process, else ddp). DATA_PARALLEL is
#: a SageMaker config's (accelerate's SageMakerDistributedType): SageMaker's data parallel library
#: all-reduces the gradients of whole replicas, as DDP does; its MODEL_PARALLEL is not planned.
DISTRIBUTED_TYPES = ("NO", "MULTI_GPU", "FSDP", "DEEPSPEED", "DATA_PARALLEL")
ZERO_STAGES = {0: Sharding.DDP, 1: Sharding.ZERO1, 2: Sharding.ZERO2, 3: Sharding.ZERO3}
#: The Trainer's full_shard next to accelerate's parallelism_config is hybrid sharding (the Trainer
#: takes parallelism from accelerate): a refinement, not a contradiction.
REFINES = {Sharding.FSDP: {Sharding.FSDP_HYBRID}}


def _read(job: JobFiles, r: Reading) -> None:
    """accelerate's distributed_type (FSDP and DeepSpeed settings included), DeepSpeed's ZeRO stage,
    the Trainer's fsdp options."""
    if job.accelerate:
        where, dt = job.accelerate_where, job.distributed_type
        if dt == "NO":
            r.set("sharding", Sharding.NONE if (job.processes or 1) <= 1 else Sharding.DDP,
                  f"{where}: distributed_type NO", REFINES)
        elif dt == "MULTI_GPU" and (loaded := _load_sharding(job, r)) is not None:
            r.set("sharding", loaded, f"{job.runtime_where}: load_sharding {loaded} (transformers' FSDP2 at load; "
                  f"{where}: distributed_type MULTI_GPU)", REFINES)
            r.set("fsdp_version", 2, f"{job.runtime_where}: transformers' DistributedConfig applies FSDP2")
            _read_gradient_sync(job, r)
        elif dt in ("MULTI_GPU", "DATA_PARALLEL"):
            r.set("sharding", Sharding.DDP, f"{where}: distributed_type {dt}", REFINES)
        elif dt is not None and dt not in DISTRIBUTED_TYPES:
            r.problems.append(f"{where}: distributed_type {dt} is not planned (planner plans NO, MULTI_GPU, FSDP, "
                              "DEEPSPEED, and a SageMaker config's DATA_PARALLEL)")
        inline = job.accelerate_inline_deepspeed
        if inline is not None and inline.get("zero_stage") is not None:
            _stage(inline["zero_stage"], f"{where}: deepspeed_config.zero_stage", r)
    for fsdp in job.fsdp:
        r.set("sharding", _fsdp_sharding(fsdp), fsdp.where, REFINES)
        r.set("fsdp_version", fsdp.version, fsdp.version_source)
    if job.fsdp:
        _read_gradient_sync(job, r)
    if job.deepspeed_where:
        zero = r.section(job.deepspeed, "zero_optimization", job.deepspeed_where)
        if "stage" in zero:
            _stage(zero["stage"], f"{job.deepspeed_where}: zero_optimization.stage", r)
        _read_buckets(zero, zero.get("stage"), f"{job.deepspeed_where}: zero_optimization", r)
    elif job.accelerate and job.accelerate_inline_deepspeed is not None:
        _read_buckets({}, job.accelerate_inline_deepspeed.get("zero_stage"), f"{job.accelerate_where}: deepspeed_config",
                      r)


def _load_sharding(job: JobFiles, r: Reading) -> Sharding | None:
    """The FSDP2 mode transformers' DistributedConfig applies at load (runtime.json's
    ``load_sharding``, beside its tensor parallelism: strategies/tensor_parallel.py), or None."""
    value = job.runtime.get("load_sharding") if job.runtime_where else None
    if value is None:
        return None
    if value not in (Sharding.FSDP, Sharding.FSDP_HYBRID):
        r.problems.append(f"{job.runtime_where}: load_sharding {value!r}: fsdp or fsdp-hybrid"[:300])
        return None
    return Sharding(value)


def _read_buckets(zero: dict, stage, where: str, r: Reading) -> None:
    """DeepSpeed's bucket settings (ZeRO-3's own only at stage 3): "auto" (0: accelerate and the
    Trainer fill it from the hidden size), a number, or where the config leaves a key out,
    DeepSpeed's default."""
    for key, name in ZERO_KEYS.items():
        if key.startswith("stage3_") and stage != 3:
            continue
        value = zero.get(key)
        if value == "auto":
            r.set(name, 0, f"{where}.{key} auto")
        elif value is None:
            r.set(name, DEEPSPEED_DEFAULTS[key], f"DeepSpeed's default ({where} sets no {key})")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and 1 <= value <= MAX_ZERO_ELEMENTS:
            r.set(name, int(value), f"{where}.{key}")
        else:
            r.problems.append(f"{where}.{key}: {value!r} is neither auto nor a number of elements from 1 to "
                              f"{MAX_ZERO_ELEMENTS:,}"[:300])


def _read_gradient_sync(job: JobFiles, r: Reading) -> None:
    """An FSDP job's gradient sync: the Trainer's ``accelerator_config.gradient_accumulation_kwargs.
    sync_each_batch``; absent, or with no Trainer file, accelerate's default (once per step)."""
    where = job.training_args_where or "training arguments"
    config = job.training_args.get("accelerator_config")
    if isinstance(config, str):
        r.warnings.append(f"{where}: accelerator_config names a file, which is not read: gradient sync taken as "
                          "accelerate's default (once per step)")
        config = None
    elif config is not None and not isinstance(config, dict):
        r.problems.append(f"{where}: accelerator_config must be a mapping or a file name, not {config!r}"[:300])
        config = None
    kwargs = r.section(config or {}, "gradient_accumulation_kwargs", f"{where}: accelerator_config")
    sync = r.typed(kwargs, "sync_each_batch", (bool,), f"{where}: accelerator_config.gradient_accumulation_kwargs")
    if sync is None:
        r.set("gradient_sync", GradientSync.STEP, "no sync_each_batch in the files: accelerate's default, once per step")
    else:
        r.set("gradient_sync", GradientSync.MICRO_BATCH if sync else GradientSync.STEP,
              f"{where}: accelerator_config.gradient_accumulation_kwargs.sync_each_batch {str(sync).lower()}")


def _stage(stage, where: str, r: Reading) -> None:
    if not isinstance(stage, int) or isinstance(stage, bool) or stage not in ZERO_STAGES:
        r.problems.append(f"{where}: ZeRO stage must be 0, 1, 2 or 3, not {stage!r}")
        return
    r.set("sharding", ZERO_STAGES[stage], where, REFINES)


def _fsdp_sharding(f: FsdpSettings) -> Sharding:
    """FSDP1's sharding_strategy (name or number) or FSDP2's reshard_after_forward, and the
    Trainer's options."""
    reshard = f.get("reshard_after_forward", True)
    # FSDP1's strategy: sharding_strategy (name or number), or reshard_after_forward's name
    strategy = str(f.get("sharding_strategy", "") or (reshard if isinstance(reshard, str) else "")).upper()
    if "SHARD_GRAD_OP" in strategy or strategy == "2" or "shard_grad_op" in f.options or reshard in (False, "false"):
        return Sharding.FSDP_GRAD_OP
    if "HYBRID" in strategy or "hybrid_shard" in f.options or strategy in ("4", "5"):
        return Sharding.FSDP_HYBRID
    if "NO_SHARD" in strategy or strategy == "3":
        return Sharding.DDP
    return Sharding.FSDP


#: One step deeper: what each mode shards next.
DEEPER = {Sharding.DDP: (Sharding.ZERO2, Sharding.ZERO3, Sharding.FSDP), Sharding.ZERO1: (Sharding.ZERO2,),
          Sharding.ZERO2: (Sharding.ZERO3,), Sharding.FSDP_GRAD_OP: (Sharding.FSDP,)}


def _savers(c, hardware: HardwareSpec) -> list[tuple[str, dict]]:
    out: list[tuple[str, dict]] = [(f"sharding {c.sharding} -> {s}", {"sharding": s}) for s in DEEPER.get(c.sharding, ())]
    if c.sharding in FSDP and c.grad_accum > 1 and c.gradient_sync == GradientSync.STEP:
        out.append(("gradient sync step -> micro-batch (sync_each_batch)", {"gradient_sync": GradientSync.MICRO_BATCH}))
    if hardware.num_gpus == 1 and c.sharding == Sharding.NONE:
        out.append(("sharding none -> zero3 (DeepSpeed on one GPU)", {"sharding": Sharding.ZERO3}))
    return out


def _default(hardware: HardwareSpec) -> Sharding:
    """none on one GPU, ddp on several."""
    return Sharding.NONE if hardware.num_gpus == 1 else Sharding.DDP


MAX_ZERO_ELEMENTS = 10**13
_ZEROS = tuple(str(z) for z in (Sharding.ZERO1, Sharding.ZERO2, Sharding.ZERO3))
SETTINGS = (Setting("fsdp_version", int, 2, "FSDP under fsdp*: 2 (fully_shard) or 1 (flat parameters, which "
                    "bitsandbytes' 8-bit and paged optimizers can step)", ge=1, le=2),
            Setting("gradient_sync", GradientSync, GradientSync.MICRO_BATCH,
                    "FSDP accumulating: reduce every micro-batch, or once per step (accelerate's default: holds "
                    "every unsharded gradient): micro-batch, step"),
            Setting("zero_reduce_bucket_size", int, 0, "ZeRO: DeepSpeed's reduce_bucket_size, elements (0: auto, "
                    "hidden x hidden)", ge=0, le=MAX_ZERO_ELEMENTS, used_at=_ZEROS),
            Setting("zero_prefetch_bucket_size", int, 0, "ZeRO-3: DeepSpeed's prefetch bucket size, elements (0: "
                    "auto, 0.9 x hidden x hidden)", ge=0, le=MAX_ZERO_ELEMENTS, used_at=(str(Sharding.ZERO3),)),
            Setting("zero_persistence_threshold", int, 0, "ZeRO-3: DeepSpeed's parameter persistence threshold, "
                    "elements (0: auto, 10 x hidden)", ge=0, le=MAX_ZERO_ELEMENTS, used_at=(str(Sharding.ZERO3),)),
            Setting("zero_max_live_parameters", int, ZERO3_MAX_LIVE_PARAMETERS, "ZeRO-3: DeepSpeed's max live parameters, "
                    "elements", ge=1, le=MAX_ZERO_ELEMENTS, used_at=(str(Sharding.ZERO3),)))


def describe(get) -> str:
    """The mode, "fsdp1" style under FSDP1 ("fsdp" alone is FSDP2)."""
    s = get("sharding")
    return f"{s} (fsdp1)" if s is not None and str(s) in FSDP and get("fsdp_version") == 1 else str(s)


STRATEGY = Strategy(
    "sharding", Sharding, Sharding.NONE, order=3, short="sharding",
    help="data parallelism and sharding: none, ddp, zero1-3 (DeepSpeed), fsdp, fsdp-grad-op, fsdp-hybrid (FSDP2; "
         "--fsdp-version 1 for FSDP1)",
    check=_check, apply=_apply, time=_time, emit=_emit, read=_read, savers=_savers, parallelism=_parallelism, storage=_storage,
    default_for=_default, runtime="planner.runtime.sharding", settings=SETTINGS, describe=describe,
    settings_used=lambda value: str(value) in FSDP,  # (the ZeRO settings: their own ``used_at``)
    records=CHOICES,
)
