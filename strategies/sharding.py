"""Data parallelism and sharding: DDP, DeepSpeed ZeRO 1-3, FSDP2 (full, grad-op, hybrid).

What each mode divides by the sharding degree N (ZeRO paper, Rajbhandari et al. 2020, Sec. 5;
FSDP: Zhao et al. 2023 "PyTorch FSDP", and the FSDP2 fully_shard docs):
- ddp: nothing; DDP's reducer also allocates flat gradient buckets covering every parameter
  (gradient_as_bucket_view=False, the default): one more gradient-sized copy.
- zero1: master weights and optimizer states. zero2: also gradients. zero3: also weights, which
  are gathered one module at a time (plus the prefetch bucket).
- fsdp (full shard): everything, gathered per decoder layer (+1 prefetched) with the root unit
  (embeddings, final norm, head) kept unsharded from forward to backward (FSDP2 does not
  reshard the root after forward). fsdp-grad-op keeps every layer unsharded between forward and
  backward. fsdp-hybrid shards within a node and replicates across nodes.

DeepSpeed settings modelled are those planner emits, the Hugging Face "auto" values:
reduce_bucket_size = h*h, stage3_prefetch_bucket_size = 0.9*h*h,
stage3_param_persistence_threshold = 10*h, stage3_max_live_parameters = 1e9,
sub_group_size = 1e9, overlap_comm = true (source: transformers integrations/deepspeed.py;
DeepSpeed runtime/zero/config.py for the defaults).
"""

from planner.cost import params as P
from planner.ledger import ALL_PHASES, LedgerDraft, Phase
from planner.vocabulary import Sharding
from strategies.base import Check, Engine, PlanContext, Strategy
from strategies.precision import layout

ZERO3_MAX_LIVE_PARAMETERS = 10**9
ZERO_SUB_GROUP_SIZE = 10**9
ALL_MODEL_STATES = ("weights", "master_weights", "optimizer_states", "gradients")
#: What each mode divides by the sharding degree; ZeRO-3 and every FSDP mode divide all four.
SHARDED_TERMS: dict[Sharding, tuple[str, ...]] = {
    Sharding.NONE: (),
    Sharding.ZERO1: ("master_weights", "optimizer_states"),
    Sharding.ZERO2: ("master_weights", "optimizer_states", "gradients"),
}
FWD, BWD, STEP = frozenset({Phase.FORWARD}), frozenset({Phase.BACKWARD}), frozenset({Phase.STEP})


def deepspeed_buckets(h: int) -> dict[str, int]:
    """The bucket sizes (elements) planner writes into DeepSpeed configs for hidden size h."""
    return {
        "reduce_bucket_size": h * h,
        "stage3_prefetch_bucket_size": int(0.9 * h * h),
        "stage3_param_persistence_threshold": 10 * h,
    }


def shard_degree(ctx: PlanContext) -> int:
    """How many ranks share one copy of the sharded states."""
    s = ctx.config.sharding
    if s in (Sharding.NONE, Sharding.DDP):
        return 1
    if s == Sharding.FSDP_HYBRID:
        return ctx.hardware.gpus_per_node
    return ctx.world_size


def _check(ctx: PlanContext, out: Check) -> None:
    s, n = ctx.config.sharding, ctx.world_size
    if s == Sharding.NONE and n > 1:
        out.infeasible.append(f"sharding none runs one process, but {n} GPUs were given; use ddp, zero1-3 or fsdp")
    if s == Sharding.DDP and n == 1:
        out.infeasible.append("ddp needs 2 or more GPUs; with one GPU use sharding none")
    if s == Sharding.FSDP_HYBRID and ctx.hardware.nodes == 1:
        out.infeasible.append("fsdp-hybrid shards within a node and replicates across nodes: it needs 2+ nodes; use fsdp")
    if s not in (Sharding.NONE, Sharding.DDP) and n == 1 and ctx.config.offload == "none":
        out.warnings.append(f"{s} on one GPU divides nothing; it only helps together with offload")


def _apply(ctx: PlanContext, ledger: LedgerDraft) -> None:
    s, m, lay, n = ctx.config.sharding, ctx.model, layout(ctx), shard_degree(ctx)
    total, layer = P.total_parameters(m), P.layer_parameters(m)
    h = m.hidden_size
    if s == Sharding.DDP:
        ledger.add(
            "communication_buffers", "DDP gradient buckets", total, lay.grad_bytes,
            note="reducer's flat buckets cover every gradient (gradient_as_bucket_view=False)",
        )
        return
    for row in ledger.of(*SHARDED_TERMS.get(s, ALL_MODEL_STATES)):
        row.shard = n
    if ctx.engine == Engine.DEEPSPEED:
        _deepspeed_rows(ctx, ledger, n, total, layer, h)
    elif ctx.engine == Engine.FSDP:
        _fsdp_rows(ctx, ledger, total, layer)


def _deepspeed_rows(ctx: PlanContext, ledger: LedgerDraft, n: int, total: int, layer: int, h: int) -> None:
    m, lay, s = ctx.model, layout(ctx), ctx.config.sharding
    b = deepspeed_buckets(h)
    ledger.add(
        "communication_buffers", "ZeRO reduce buckets (x2, overlap_comm)", 2 * b["reduce_bucket_size"], lay.grad_bytes,
        note="reduce_bucket_size = h*h",
    )
    fp32_partition = min(-(-total // n), ZERO_SUB_GROUP_SIZE) if s == Sharding.ZERO3 else -(-total // n)
    ledger.add(
        "optimizer_step_temporaries", "fp32 gradient partition for the step", fp32_partition, 4,
        phases=STEP, tag="fp32_grad_partition", note="16-bit gradient partition upcast for the optimizer",
    )
    if s != Sharding.ZERO3:
        return
    threshold = b["stage3_param_persistence_threshold"]
    persistent = sum(t.numel * P.multiplicity(m, t) for t in P.model_tensors(m) if t.numel <= threshold)
    ledger.add(
        "weights", "ZeRO-3 persistent small parameters (unpartitioned)", persistent * (n - 1) / n, lay.weight_bytes,
        note=f"tensors <= stage3_param_persistence_threshold ({threshold:,} elements)",
    )
    head = m.vocab_size * h
    prefetch = b["stage3_prefetch_bucket_size"]
    live = ZERO3_MAX_LIVE_PARAMETERS
    ledger.add(
        "gathered_parameters", "ZeRO-3 gathered head + prefetch", min(live, head + prefetch), lay.gathered_bytes,
        phases=FWD, note="the output head is gathered at the loss; prefetch bucket 0.9*h*h",
    )
    ledger.add(
        "gathered_parameters", "ZeRO-3 gathered layer + prefetch (backward)", min(live, layer + prefetch),
        lay.gathered_bytes, phases=BWD, note="one decoder layer and the prefetch bucket",
    )
    ledger.add("gathered_parameters", "ZeRO-3 unpartitioned layer gradients", layer, lay.grad_bytes, phases=BWD)


def _fsdp_rows(ctx: PlanContext, ledger: LedgerDraft, total: int, layer: int) -> None:
    m, lay = ctx.model, layout(ctx)
    root = P.root_parameters(m)
    g = lay.gathered_bytes
    if ctx.config.sharding == Sharding.FSDP_GRAD_OP:
        ledger.add(
            "gathered_parameters", "unsharded parameters kept from forward to backward", total, g, phases=FWD,
            note="reshard_after_forward=False",
        )
    else:
        ledger.add(
            "gathered_parameters", "FSDP root unit (embeddings, norm, head) + 2 layers", root + 2 * layer, g, phases=FWD,
            note="root stays unsharded; one layer computing, one prefetched",
        )
    ledger.add(
        "gathered_parameters", "FSDP root unit + 2 layers (backward)", root + 2 * layer, g, phases=BWD,
        note="one layer computing, one prefetched",
    )
    reduce_bytes = g + (4 if g < 4 else 0)  # unsharded grads in param_dtype, upcast to fp32 for reduce-scatter
    ledger.add(
        "communication_buffers", "unsharded layer gradients for reduce-scatter", layer, reduce_bytes, phases=BWD,
        note=f"{g} B param_dtype gradient" + (" + fp32 reduce copy" if g < 4 else ""),
    )


STRATEGY = Strategy("sharding", tuple(Sharding), _check, _apply)
