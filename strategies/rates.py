"""This plan's achieved rates on its GPU, and the compute times several strategies share.

Rate = datasheet dense peak x achieved fraction (GpuSpec.efficiency, from
planner/catalog/data/efficiency.yaml). Matmul time per pass is a roofline: the larger of
FLOPs / matmul rate and weight bytes read / memory bandwidth (small micro-batches are bound by
reading the weights). Unit: seconds per micro-batch.
"""

from planner.core.timing import ASSUMED_RATE_TERMS
from planner.core.units import DTYPE_BYTES
from planner.cost import comms, compute, overheads, params
from planner.strategies.base import PlanContext


def page_migration_rate(hw) -> float:
    """Bytes a second paged optimizer state migrates between host RAM and the GPU (its round
    trip's rate): ``--page-migration-gb-s``, else measured beside this GPU (GpuSpec.host_rates:
    the catalog's or a calibration's), else the assumption (``overheads.PAGE_MIGRATION_LINK_FRACTION``
    of the host link)."""
    return _rate(hw, "paged_migration", None)[0]


def cpu_optimizer_rate(hw, engine: str) -> float:
    """Parameters a second a node's CPUs update in ``engine``'s optimizer step on the host
    (DeepSpeed CPU-Adam, FSDP2's torch AdamW on the host shard): ``--cpu-optimizer-gparams-s``,
    else measured in that engine beside this GPU (GpuSpec.host_rates), else
    ``overheads.CPU_OPTIMIZER_PARAMS_PER_SECOND_PER_NODE``."""
    return _rate(hw, "cpu_optimizer_step", engine)[0]


#: Where a rate comes from: the user's flag, a measurement beside the GPU, or planner's assumption.
FLAG, MEASURED, ASSUMED = "flag", "measured", "assumed"


def rate_origin(hw, term: str, engine: str | None) -> tuple[str, str]:
    """(FLAG | MEASURED | ASSUMED, where it was measured) for one of ``ASSUMED_RATE_TERMS``'s rates."""
    return _rate(hw, term, engine)[1:]


def assumed_terms(hw, engine: str | None) -> tuple[str, ...]:
    """The terms of ``ASSUMED_RATE_TERMS`` whose rate, for this hardware and engine, no flag sets
    and nothing measured: a plan's speed that rests on them rests on an assumption."""
    return tuple(t for t in ASSUMED_RATE_TERMS if _rate(hw, t, engine)[1] == ASSUMED)


def _rate(hw, term: str, engine: str | None) -> tuple[float, str, str]:
    measured = hw.gpu.host_rates
    if term == "paged_migration":
        if hw.page_migration_bytes_per_s is not None:
            return hw.page_migration_bytes_per_s, FLAG, ""
        if measured is not None and measured.page_migration_bytes_per_s is not None:
            return measured.page_migration_bytes_per_s, MEASURED, measured.sources.get("page_migration", "")
        return hw.gpu.host_link_bytes_per_s * overheads.PAGE_MIGRATION_LINK_FRACTION, ASSUMED, ""
    if hw.cpu_optimizer_params_per_s is not None:
        return hw.cpu_optimizer_params_per_s, FLAG, ""
    if measured is not None and engine in measured.cpu_optimizer_params_per_s:
        return (measured.cpu_optimizer_params_per_s[engine], MEASURED,
                measured.sources.get(f"cpu_optimizer:{engine}", ""))
    return overheads.CPU_OPTIMIZER_PARAMS_PER_SECOND_PER_NODE, ASSUMED, ""


def dense_peak(gpu, dtype: str) -> float:
    """The GPU's dense peak in ``dtype``, FLOP/s, or its fp32 peak where it has none (every GPU has
    an fp32 peak: the catalog's loader requires it)."""
    peak = gpu.dense_flops_per_s.get(dtype) or gpu.dense_flops_per_s["fp32"]
    assert peak is not None, gpu.name
    return peak


#: MFU's one basis, whatever a plan computes in: the GPU's first 16-bit dense peak it has, so an
#: fp32 plan's MFU is not quoted against its own (far lower) peak above a bf16 plan's, and an fp8
#: plan's against the 16-bit peak, as MFU is published.
MFU_DTYPES = ("bf16", "fp16", "fp32")


def peak_dtype(ctx: PlanContext) -> str:
    """The dtype of MFU's denominator: the first of ``MFU_DTYPES`` the GPU has a peak for."""
    have = ctx.hardware.gpu.dense_flops_per_s
    return next(d for d in MFU_DTYPES if have.get(d))


def peak_flops(ctx: PlanContext) -> float:
    """MFU's denominator: the GPU's dense peak in ``peak_dtype``, FLOP/s (one basis for every plan)."""
    return dense_peak(ctx.hardware.gpu, peak_dtype(ctx))


def saturation(ctx: PlanContext) -> float:
    """Fraction of the large-shape rate reached with T tokens per micro-batch: T / (T + T0).

    Kernels on fewer tokens (smaller matmul M dimension, fewer attention rows) fill fewer waves
    of the GPU's SMs and pay fixed per-layer costs; T0 per architecture is fitted to published
    end-to-end MFU at several micro-batch sizes (efficiency.yaml)."""
    t0 = ctx.hardware.gpu.efficiency.saturation_tokens
    t = tokens(ctx)
    return t / (t + t0)


def matmul_rate(ctx: PlanContext, dtype: str) -> float:
    gpu = ctx.hardware.gpu
    return dense_peak(gpu, dtype) * gpu.efficiency.gemm_for(dtype) * saturation(ctx)


def bandwidth(ctx: PlanContext) -> float:
    gpu = ctx.hardware.gpu
    return gpu.memory_bandwidth_bytes_per_s * gpu.efficiency.memory_bandwidth


def tokens(ctx: PlanContext) -> float:
    """Tokens the kernels run per micro-batch, padding included (planner/core/lengths.py)."""
    return ctx.config.kernel_tokens_per_micro_batch


def layer_matmul_forward_seconds(ctx: PlanContext, tensors=None) -> float:
    """Decoder-layer matmuls, one forward pass (fp8 under fp8-mixed: torchao converts the
    layers' linears, not the output head): FLOPs at the matmul rate or reading the weights at the
    memory bandwidth, the larger. ``tensors``: only these of one layer's matmul weights
    (planner.cost.params.layer_matmuls; e.g. those selective checkpointing recomputes), 2 FLOPs per
    active parameter per token (routed experts: top-k; the 6N rule's forward, Kaplan et al. 2020)."""
    m = ctx.model
    dtype = ctx.layout.layer_matmul_dtype
    if tensors is None:
        flops = compute.matmul_flops_per_token(m, layers_only=True) * tokens(ctx)
        weight_bytes = params.layer_matmul_parameters(m) * m.num_layers * DTYPE_BYTES[dtype]
    else:
        flops = 2.0 * sum(params.active_elements(m, t) for t in tensors) * m.num_layers * tokens(ctx)
        weight_bytes = sum(t.numel for t in tensors) * m.num_layers * DTYPE_BYTES[dtype]
    return max(flops / matmul_rate(ctx, dtype), weight_bytes / bandwidth(ctx))


def head_matmul_forward_seconds(ctx: PlanContext) -> float:
    m, dtype = ctx.model, ctx.layout.compute_dtype
    flops = (compute.matmul_flops_per_token(m) - compute.matmul_flops_per_token(m, layers_only=True)) * tokens(ctx)
    weight_bytes = m.vocab_rows * m.hidden_size * DTYPE_BYTES[dtype]
    return max(flops / matmul_rate(ctx, dtype), weight_bytes / bandwidth(ctx))


def attention_forward_seconds(ctx: PlanContext) -> float:
    """Fused attention runs at the GPU's attention efficiency and skips masked blocks; eager
    attention computes the full square with batched GEMMs and writes and reads its s^2 scores,
    fp32 probabilities and their casts ((3c + 8) * a * s bytes per token per layer)."""
    m, cfg = ctx.model, ctx.config
    dtype = ctx.layout.compute_dtype
    if ctx.layout.fused_attention:
        flops = compute.attention_flops_per_token(m, cfg.attention_len, causal_skip=True) * tokens(ctx)
        return flops / (peak_flops(ctx) * ctx.hardware.gpu.efficiency.attention * saturation(ctx))
    flops = compute.attention_flops_per_token(m, cfg.attention_len, causal_skip=False) * tokens(ctx)
    c = DTYPE_BYTES[dtype]
    traffic = (3 * c + 8) * m.num_heads * cfg.attention_len * m.num_layers * tokens(ctx)
    return flops / matmul_rate(ctx, dtype) + traffic / bandwidth(ctx)


def elementwise_forward_seconds(ctx: PlanContext, saved_bytes_per_token_per_layer: float) -> float:
    """Norms, activations, RoPE, residual adds: memory bound. Assumption: a forward pass moves
    about the bytes its saved activations occupy (each written once); backward moves twice that
    (reads them, writes their gradients). Not fitted separately: ``planner calibrate``'s FLOP/s factor
    absorbs its error on the measured GPU."""
    return saved_bytes_per_token_per_layer * ctx.model.num_layers * tokens(ctx) / bandwidth(ctx)


def link(ctx: PlanContext, spans_nodes: bool) -> tuple[float, float]:
    """(bytes/s, latency per collective) of a group's collectives: the slowest link it spans (the
    GPU link inside a node; across nodes, each GPU's share of the node's network)."""
    hw = ctx.hardware
    if spans_nodes:
        return min(hw.gpu.gpu_link_bytes_per_s, hw.inter_node_bytes_per_s_per_gpu), overheads.COLLECTIVE_LATENCY_INTER_S
    return hw.gpu.gpu_link_bytes_per_s, overheads.COLLECTIVE_LATENCY_INTRA_S


def collective_seconds(n_bytes: float, over: tuple[float, float], calls: int) -> float:
    """Seconds to send ``n_bytes`` per rank over ``over`` (``link``) in ``calls`` collectives, at
    planner/cost/overheads.py ``LINK_EFFICIENCY``, each call paying the link's latency."""
    return comms.transfer_seconds(n_bytes, over[0], overheads.LINK_EFFICIENCY, calls * over[1])
