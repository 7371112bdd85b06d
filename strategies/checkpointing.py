"""Activation checkpointing: which activations a layer keeps, and the recompute peak.

- none: every tensor each layer saves (planner.cost.activations.layer_saved).
- selective: torchtitan's op-level selective AC (``SELECTIVE_POLICY``): the layer input, the
  attention kernel's outputs and every other matmul's output (the 1st, 3rd, ... of the layer);
  the other matmuls, norms, activations and RoPE are recomputed in backward.
- full: the layer input only (HF gradient checkpointing); during backward one layer is
  recomputed in full. Korthikanti et al. 2022, Sec. 5: 2*s*b*h per layer in 16 bit. Beside it,
  under the non-reentrant checkpoint, what a quantized base's matmuls keep out of the
  checkpoint's sight (``CheckpointImpl``).
In every mode, at the first layer's backward its saved tensors (recomputed or kept) and its
gradient temporaries are alive (``first_layer_backward``); the checkpointed layer input that
recomputation starts from (r*h bytes per token) is counted as part of that layer, which
understates the recompute case by that one vector per token (< 0.1% of a step's peak).
"""

from dataclasses import dataclass
from enum import StrEnum

from planner.core import job as job_module
from planner.core.emitted import EmitDraft
from planner.core.job import JobFiles, Reading
from planner.core.ledger import LedgerDraft, PagedInfo, Phase
from planner.core.specs import HardwareSpec
from planner.core.timing import TimeDraft, Window
from planner.core.vocabulary import Setting
from planner.cost import activations, adapters, overheads, params
from planner.strategies import rates
from planner.strategies.base import Choice, Engine, PlanContext, Strategy
from planner.strategies.fsdp_schedule import (
    Instant,
    forward_instants,
    gathered_bytes,
    layers_saved,
    reduce_scatter_input_elements,
)
from planner.strategies.fsdp_units import layer_backward_extra
from planner.strategies.moments import (
    LAST_LAYER_FORWARD,
    LOSS_MOMENT,
)
from planner.strategies.sequence_parallel import exchange_bytes, exchange_words


class Checkpointing(StrEnum):
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class CheckpointImpl(StrEnum):
    """torch.utils.checkpoint's two implementations under full checkpointing. Both keep what
    autograd saves only for the checkpointed layer being recomputed; they differ for tensors an op
    keeps on its autograd context outside ``save_for_backward`` (bitsandbytes' quantized matmuls:
    planner.cost.adapters.kept_input_bytes): the non-reentrant forward builds the graph, so every
    layer keeps them; the reentrant forward runs without a graph, so only the recomputed layer
    does."""

    NON_REENTRANT = "non-reentrant"
    REENTRANT = "reentrant"


#: The first transformers whose ``gradient_checkpointing_enable`` defaults to non-reentrant
#: checkpointing when the Trainer passes no ``gradient_checkpointing_kwargs``: 4.57.1 defaults to
#: ``{"use_reentrant": True}``, 5.0.0 to ``{"use_reentrant": False}`` (their modeling_utils.py);
#: earlier 4.x releases are taken as 4.57.1.
NON_REENTRANT_DEFAULT_SINCE = (5, 0)

SETTINGS = (
    Setting("checkpoint_impl", CheckpointImpl, CheckpointImpl.NON_REENTRANT,
            "torch's checkpoint under full checkpointing: non-reentrant (planner's launch, transformers >= 5's "
            "default) or reentrant (transformers 4's default, axolotl's and LLaMA-Factory's)", used_at=("full",)),
)


#: Every checkpointing value. Recompute in backward adds complexity, and it interleaves short-lived
#: activations with the gradients. Reserved less allocated peak, less the loss's logits hole and
#: the base reserve, as a fraction of the allocated peak on an H100 (expandable segments;
#: docs/measured.md): full 7.6 % (Llama-3.2-1B), 9.5 % and 4.3 % (Qwen2.5-0.5B, 4 x 1024 and
#: 2 x 4096), 0.6-0.8 % (Llama-3.1-8B, bf16-pure 8-bit states); selective 5.5 % (Llama-3.2-1B).
#: Full's 7.5 % covers all but Qwen's 4 x 1024 by 2 %: safe for the small models whose reserve is
#: a large share, wide for 8B (open: what scales it). Selective is the runtime's (its per-op
#: policy is no file's key).
CHOICES: dict[Checkpointing, Choice] = {
    Checkpointing.NONE: Choice("every layer keeps its saved activations"),
    Checkpointing.SELECTIVE: Choice("torchtitan's per-op policy: saves attention and every other matmul output",
                                    complexity=1, reserve=0.055, runtime_only=True),
    Checkpointing.FULL: Choice("each layer keeps its input and recomputes the rest in backward", complexity=1,
                               reserve=0.075),
}


@dataclass(frozen=True)
class SelectivePolicy:
    """Selective checkpointing's policy: torchtitan's op-level selective activation checkpointing.

    Source: pytorch/torchtitan at cfb93265153094f99736547f26b5346410181102,
    torchtitan/distributed/activation_checkpoint.py ``_apply_op_sac`` (the rule),
    torchtitan/models/llama3/parallelize.py ``_op_sac_save_list`` (the ops) and
    torchtitan/config/configs.py (``per_op_sac_force_recompute_mm_shapes_by_fqns`` =
    ["moe.router.gate"]). Per call of a checkpointed decoder layer a fresh counter, one for the
    forward and one for the recompute (``mode = "recompute" if ctx.is_recompute else "forward"``)::

        if func == aten.mm.default:
            if args[1].shape in router_shapes: return PREFER_RECOMPUTE
            meta[f"{mode}_mm_count"] += 1
        to_save = func in save_list and not (func == aten.mm.default and meta[count] % 2 == 0)
        return MUST_SAVE if to_save else PREFER_RECOMPUTE

    (and a CUDA-to-CPU ``_to_copy`` is always saved). So a layer keeps the outputs of the listed
    ops except every second matmul (the 2nd, 4th, ... of the layer are recomputed) and a MoE
    router's, and recomputes everything else: norms, activations, RoPE, eager attention's bmm,
    MoE experts' grouped_mm. Adapted to Hugging Face models: a linear with a bias (Qwen2's q/k/v,
    GPT-2's Conv1D) dispatches to ``addmm``, not ``mm``; torchtitan's models have no biases, so its
    rule means every linear: ``addmm`` is counted and saved exactly like ``mm``. On the CPU (the
    traced probe) SDPA runs ``_scaled_dot_product_flash_attention_for_cpu``, saved like the CUDA
    kernels. The list's higher-order ops (flex attention, varlen attention, compiled regions) are
    left out: the planner's attention choices (sdpa, eager) run none of them. One definition for
    all: the runtime (planner/runtime/checkpointing.py) applies it, and the ledger
    (``planner.cost.activations.selective_matmuls``, ``layer_selective``) counts what it keeps
    and recomputes.
    """

    #: ops (``torch.ops.<namespace>.<name>.default``) whose outputs are saved
    save_ops: tuple[str, ...] = (
        "aten.mm", "aten.addmm",
        "aten._scaled_dot_product_efficient_attention", "aten._scaled_dot_product_flash_attention",
        "aten._scaled_dot_product_cudnn_attention", "aten._scaled_dot_product_attention_math",
        "aten._scaled_dot_product_fused_attention_overrideable", "aten._scaled_dot_product_flash_attention_for_cpu",
        "_c10d_functional.reduce_scatter_tensor", "aten.max",  # aten.max: fp8 amax (a scalar)
    )
    #: the matmuls the every-second rule counts (torchtitan: mm alone; here its biased form too)
    counted_ops: tuple[str, ...] = ("aten.mm", "aten.addmm")
    #: the last name of a MoE router module (HF ``mlp.gate`` / ``block_sparse_moe.gate``; dense MLPs
    #: name theirs ``gate_proj``): matmuls of its weight's shape are recomputed and not counted
    router_module: str = "gate"


SELECTIVE_POLICY = SelectivePolicy()


def layer_saved_bytes(ctx: PlanContext) -> float:
    """Bytes per token one decoder layer saves for backward without checkpointing: the full
    fine-tuning list, or with an adapter on a frozen base the adapter's
    (planner.cost.adapters.adapter_layer_saved; its fp32 adapters under autocast are ``cast``)."""
    m, lay, cfg = ctx.model, ctx.layout, ctx.config
    spec = lay.adapter
    if spec is None or m.is_moe:  # (a MoE adapter plan is refused: strategies/adapter.py)
        return activations.total(activations.layer_saved(m, lay.dtypes, lay.fused_attention, cfg.seq_len,
                                                         ctx.config.sequence_shards, ctx.config.heads_shards,
                                                         tiled(ctx)))
    cast = adapters.casts_adapter_input(spec, lay.weight_bytes, lay.dtypes.compute)
    # (a prepared base on a layer it is not modelled for is refused: strategies/adapter.py; its
    # figure is then the unprepared list's)
    prepared = spec.fp32_norms and not adapters.kbit_prep_supported(m)
    dt = lay.dtypes if prepared or not spec.fp32_norms else activations.DTypes(lay.dtypes.compute, lay.dtypes.compute)
    return activations.total(adapters.adapter_layer_saved(m, dt, lay.fused_attention, cfg.seq_len, spec.targets,
                                                          spec.rank, spec.dropout, cast, spec.dora, spec.base_keeps_inputs,
                                                          copy_bytes=lay.adapter_copy_bytes, prepared=prepared,
                                                          sp=ctx.config.sequence_shards, heads=ctx.config.heads_shards))


def tiled(ctx: PlanContext) -> bool:
    """Whether each layer's MLP runs through DeepSpeed's TiledMLP (strategies/tiled_mlp.py)."""
    return ctx.config.tiled_mlp == "tiled"


def tile_bytes(ctx: PlanContext) -> float:
    """Bytes of one TiledMLP tile in its backward (0 untiled): the MLP's intermediates recomputed
    with autograd for the tile and their gradients (planner.cost.activations
    ``mlp_intermediates``, ``mlp_gradient_bytes``), over ``tiled_mlp_tile_tokens`` tokens (the
    rank's share of a split sequence); no autocast (refused under it: strategies/tiled_mlp.py)."""
    if not tiled(ctx):
        return 0.0
    m, dt, cfg = ctx.model, ctx.layout.dtypes, ctx.config
    tokens = activations.tiled_mlp_tile_tokens(cfg.seq_len // cfg.sequence_shards, cfg.micro_batch_size, m.hidden_size)
    return (activations.total(tuple(activations.mlp_intermediates(m, dt))) + activations.mlp_gradient_bytes(m, dt)) * tokens


def mlp_backward_bytes(ctx: PlanContext) -> float:
    """One layer's MLP gradient temporaries in its backward, bytes per token
    (planner.cost.activations ``mlp_backward_transient_bytes``): over a k-bit prepared base the
    MLP's intermediates and the residual stream are fp32, and so are their gradients. Tiled
    (``tiled``): two residual-stream gradients and TiledMLP's gradient of its whole input (the
    input's dtype, the residual's), the intermediates' a tile's (``tile_bytes``)."""
    lay = ctx.layout
    if tiled(ctx):
        return 3 * lay.dtypes.residual * ctx.model.hidden_size
    if lay.adapter is not None and lay.adapter.fp32_norms:
        return activations.mlp_backward_transient_bytes(ctx.model, activations.DTypes(activations.FP32, activations.FP32))
    return activations.mlp_backward_transient_bytes(ctx.model, lay.dtypes)


def adapter_backward_bytes(ctx: PlanContext) -> float:
    """An adapter's gradient temporaries in a layer's backward, bytes per token: the backward
    phase's peak holds them when the layer is recomputed (full checkpointing); without
    checkpointing the peak is elsewhere in the layer (traced: benchmarks/adapter_traced_matrix.py).
    0 without an adapter."""
    lay = ctx.layout
    if (lay.adapter is None or ctx.config.checkpointing != Checkpointing.FULL
            or not adapters.casts_adapter_input(lay.adapter, lay.weight_bytes, lay.dtypes.compute)):
        return 0.0
    return adapters.adapter_backward_transient_bytes(ctx.model, lay.adapter.targets, lay.weight_bytes, lay.dtypes.compute)


def per_layer_forward_bytes(ctx: PlanContext) -> float:
    """Bytes per token one layer holds from its forward until its backward; under full
    checkpointing the layer's input, and under the non-reentrant checkpoint the inputs a quantized
    base's matmuls keep out of its sight (planner.cost.adapters.kept_input_bytes; under the
    reentrant one only the recomputed layer keeps them, in its saved list)."""
    m, dt, cfg = ctx.model, ctx.layout.dtypes, ctx.config
    match cfg.checkpointing:
        case Checkpointing.NONE:
            return layer_saved_bytes(ctx)
        case Checkpointing.SELECTIVE:
            return activations.total(activations.layer_selective(m, dt, ctx.layout.fused_attention, cfg.seq_len))
        case Checkpointing.FULL:
            spec = ctx.layout.adapter
            kept = (adapters.kept_input_bytes(m, dt) if spec is not None and spec.base_keeps_inputs
                    and cfg.checkpoint_impl == CheckpointImpl.NON_REENTRANT else 0.0)
            return (0.0 if _offloaded(ctx) else activations.layer_input_bytes(m, dt)) + kept
    raise ValueError(cfg.checkpointing)


def _offloaded(ctx: PlanContext) -> bool:
    """Full checkpointing with its inputs in host RAM (strategies/checkpoint_offload.py)."""
    return ctx.config.checkpointing == Checkpointing.FULL and ctx.config.checkpoint_offload == "host"


def fsdp_checkpoints(ctx: PlanContext) -> bool:
    """Whether FSDP's own activation checkpointing runs the plan's full checkpointing (FSDP, non-
    reentrant: accelerate wraps each layer so), not the Trainer's (``_emit``); not where transformers
    applies FSDP2 at load (tensor parallelism: accelerate wraps nothing)."""
    return ctx.engine == Engine.FSDP and ctx.config.checkpoint_impl != CheckpointImpl.REENTRANT and ctx.tensor_shards == 1


def offloaded_input_bytes(ctx: PlanContext) -> float:
    """Bytes per token of one layer's checkpointed inputs that activation-checkpoint offload keeps
    in host RAM (0 without it): the layer's input, and under FSDP's own checkpointing (which saves
    keyword tensors too) its own copy of the rotary cos and sin (2 x head_dim, the residual's
    dtype); strategies/checkpoint_offload.py."""
    if not _offloaded(ctx):
        return 0.0
    m, dt = ctx.model, ctx.layout.dtypes
    rotary = 2 * m.head_dim * dt.residual if fsdp_checkpoints(ctx) and not m.learned_position_embeddings else 0.0
    return activations.layer_input_bytes(m, dt) + rotary


def _apply(ctx: PlanContext, ledger: LedgerDraft) -> None:
    m, dt, cfg = ctx.model, ctx.layout.dtypes, ctx.config
    tokens = cfg.tokens_per_micro_batch
    per_layer = per_layer_forward_bytes(ctx)
    note = f"{per_layer:,.0f} B/token/layer x {tokens:,} tokens"
    if instants := forward_instants(ctx):  # FSDP: the layers' saved tensors at each instant of its forward
        for instant in instants:
            layers = layers_saved(ctx, instant)
            ledger.add("activations", f"saved activations, {layers} layers ({cfg.checkpointing})", per_layer * layers,
                       tokens, phases=frozenset({Phase.FORWARD}), moment=str(instant), note=note)
    else:
        ledger.add("activations", f"saved activations, {m.num_layers} layers ({cfg.checkpointing})",
                   per_layer * m.num_layers, tokens, phases=frozenset({Phase.FORWARD}), note=note)
    ledger.add(
        "activations", "final norm and head input", activations.final_norm_bytes(m, dt), tokens,
        phases=frozenset({Phase.FORWARD}), moment=LOSS_MOMENT,
    )
    if embedding_dropout := activations.embedding_dropout_bytes(m):
        ledger.add("activations", "embedding dropout mask", embedding_dropout, tokens,
                   phases=frozenset({Phase.FORWARD, Phase.BACKWARD}),
                   note="outside the layers: kept until the backward reaches the embeddings")
    masks = activations.mask_bytes(m, dt, ctx.layout.fused_attention, cfg.seq_len)
    if cfg.checkpointing != Checkpointing.NONE and masks:
        ledger.add("activations", "attention masks (checkpoint inputs)", masks, tokens,
                   phases=frozenset({Phase.FORWARD, Phase.BACKWARD}),
                   note="(b, 1, s, s) per mask kind, kept by every checkpointed layer until its backward")
    if top := top_layer_forward(ctx):
        label, extra = top
        ledger.add("activations", f"the top layer's forward: {label}", max(0.0, extra - per_layer), tokens,
                   phases=frozenset({Phase.FORWARD}), moment=LAST_LAYER_FORWARD,
                   note="instead of the layer's (checkpointed) saved set")
    if not ctx.layout.fused_attention:
        from planner.strategies.precision import cache_only_casts  # (precision imports this module)

        # the autocast cache holds every layer's casts at the top layer's forward
        if cached := cache_only_casts(ctx):
            ledger.add("autocast_weight_copies", "autocast casts of the layers' matmul weights (cached)", cached, 1,
                       phases=frozenset({Phase.FORWARD}), moment=LAST_LAYER_FORWARD)
    peak = backward_peak(ctx)
    for term, what in (("gradients", "gradients so far"), ("autocast_weight_copies", "weight casts"),
                       ("gathered_parameters", "FSDP's unsharded layers"),
                       ("activations", "activations and gradient temporaries")):
        ledger.add(term, f"{peak.who}, {peak.label}: {what}", peak.held[term], 1, phases=frozenset({Phase.BACKWARD}),
                   note="the largest of the top, the second (FSDP) and the first layer's backward")


@dataclass(frozen=True)
class BackwardPeak:
    """The backward phase's peak instant and what it holds beyond the rows every instant shares:
    bytes per term (``held``, this module's rows), and whether the gradients made before the first
    layer's backward (strategies/precision.py's row) and the layer above's reduce-scatter input
    (strategies/fsdp_memory.py's row) are resident, so each writer writes its row only then."""

    who: str
    label: str
    held: dict[str, float]
    gradients_before: bool
    reduce_scatter_in_flight: bool


def backward_peak(ctx: PlanContext) -> BackwardPeak:
    """The backward phase's peak, decided once per plan (``PlanContext.once``)."""
    return ctx.once(_backward_peak)


def _backward_peak(ctx: PlanContext) -> BackwardPeak:
    """The largest of the top layer's backward, the next one's (FSDP: with the top layer's
    reduce-scatter input in flight) and the first layer's (with every gradient made before it and
    the second layer's reduce-scatter input); the layers between lie on the line from the second to
    the first (each frees one layer's saved tensors, adds its gradients). Ties go to the first."""
    from planner.strategies.precision import gradients_before_first_layer  # (precision imports this module)

    lay = ctx.layout
    before = gradients_before_first_layer(ctx)
    gradients = lay.placement("gradients").gpu_bytes(*before) if before else 0
    in_flight = reduce_scatter_input_elements(ctx) * lay.reduce_bytes
    first_label, first = first_layer_backward(ctx)
    candidates = [BackwardPeak("first layer's backward", first_label, first, True, True),
                  BackwardPeak("top layer's backward", *top_layer_backward(ctx), False, False)]
    if in_flight and ctx.model.num_layers > 2:
        candidates.append(BackwardPeak("second layer's backward", *second_layer_backward(ctx), False, True))
    fsdp = ctx.engine == Engine.FSDP  # (the units outside the layers, by instant: strategies/fsdp_units.py)
    on_top, on_first = (layer_backward_extra(ctx, False), layer_backward_extra(ctx, True)) if fsdp else (0, 0)
    return max(candidates, key=lambda c: sum(c.held.values())
               + (gradients * c.gradients_before + in_flight * c.reduce_scatter_in_flight)
               + (on_first if c.gradients_before else 0 if c.reduce_scatter_in_flight else on_top))


def top_layer_forward(ctx: PlanContext) -> tuple[str, float] | None:
    """The largest instant of the top layer's forward, bytes per token of that layer (the ledger
    sets it against the layer's saved set), or None where the saved set is the most:
    - eager attention's softmax: the attention half's saved tensors made before it and the scores
      in flight (``eager_attention_instants``);
    - a split sequence: the attention half's saved tensors and Ulysses' all-to-alls' copies or ring
      attention's gathered keys and values and fp32 merge (strategies/sequence_parallel.py
      ``exchange_bytes``);
    - MoE: where the experts' outputs are combined, the layer's saved tensors so far (without
      checkpointing, its whole set; checkpointed, the layer input, the experts' gathered input and
      output, the python locals the forward still holds) and the fp32 routing-weighted outputs in
      flight (``moe_combine_transient_bytes``).
    Traced (benchmarks/traced_matrix.py: Llama-3.2-1B eager, Mixtral 8x7B)."""
    m, dt, cfg = ctx.model, ctx.layout.dtypes, ctx.config
    instants = {}
    if not ctx.layout.fused_attention:
        instants["eager attention's masked scores and softmax in flight"] = (
            activations.eager_attention_instants(m, dt, cfg.seq_len)["forward"])
    if exchange := exchange_bytes(ctx):
        instants[exchange_words(ctx)] = (
            activations.total(activations.attention_saved(m, dt, ctx.layout.fused_attention, cfg.seq_len,
                                                          cfg.sequence_shards, cfg.heads_shards)) + exchange)
    if m.is_moe:
        kept = (activations.total(activations.layer_saved(m, dt, ctx.layout.fused_attention, cfg.seq_len,
                                                          ctx.config.sequence_shards, ctx.config.heads_shards))
                if cfg.checkpointing == Checkpointing.NONE
                else activations.layer_input_bytes(m, dt) + 2 * dt.compute * m.hidden_size * m.experts_per_token)
        instants["the experts' fp32 weighted outputs in flight"] = kept + activations.moe_combine_transient_bytes(m)
    if not instants:
        return None
    label = max(instants, key=lambda k: instants[k])
    return label, instants[label]


def _attention_backward(ctx: PlanContext) -> float:
    """Bytes per token of one layer's attention half at its backward's largest instant: its saved
    tensors and gradient temporaries (eager: ``eager_attention_instants``), and a split sequence's
    exchange in backward (``exchange_bytes``: Ulysses' all-to-all copies of the gradients, ring
    attention's gathered keys and values and fp32 gradient accumulators)."""
    m, dt, s = ctx.model, ctx.layout.dtypes, ctx.config.seq_len
    if not ctx.layout.fused_attention:
        return activations.eager_attention_instants(m, dt, s)["backward"]
    return (activations.total(activations.attention_saved(m, dt, True, s, ctx.config.sequence_shards, ctx.config.heads_shards))
            + activations.attention_backward_transient_bytes(m, dt, True, s) + exchange_bytes(ctx, backward=True))


def _fp8_gradient_casts(ctx: PlanContext) -> float:
    """Float8Linear's gradient cast in a layer's backward, bytes per token (0 unless fp8-mixed)."""
    return activations.fp8_gradient_cast_bytes(ctx.model) if ctx.config.precision == "fp8-mixed" else 0


def top_layer_backward(ctx: PlanContext) -> tuple[str, dict[str, float]]:
    """The top decoder layer's backward, bytes per term beyond the sharding buffers: the larger of
    its start and its end.

    From the top layer down, each layer's backward adds its gradients and frees its saved tensors,
    so the ledger's ``backward`` phase is the larger of the top and the first layer's moments
    (``first_layer_backward``). At the top's start: the head's (and final norm's) gradients (none
    here when sharded: FSDP holds them unsharded as a buffer), every layer below still holding its
    saved tensors (checkpointed form), the top layer's full saved set, its MLP gradient temporaries
    and its autocast casts (with the layers' below when checkpointing none keeps them). At its
    attention's backward: the MLP and output projection's gradients, the attention half's saved
    tensors and its gradient temporaries (eager: two a*s softmax gradients, which outweigh the MLP
    at long sequences: Mistral-7B eager at 1 x 8192 peaks here in the trace). At its end:
    the layer's gradients too, its saved tensors gone but two residual gradients. FSDP: the top layer
    and the next one (prefetched) unsharded, and the top layer's unsharded gradients at its end
    (the gathered layers break the linearity the ends rely on, so the end counts). No layer above
    has a reduce-scatter input in flight (FSDP), so that row goes when this moment is the larger.
    """
    m, lay, cfg = ctx.model, ctx.layout, ctx.config
    dt, T = lay.dtypes, cfg.tokens_per_micro_batch
    fsdp = ctx.engine == Engine.FSDP
    # (an adapter's gradients are the precision strategy's row over the whole backward)
    g = 0 if ctx.layout.gradients_sharded or cfg.grad_accum > 1 or lay.adapter else lay.grad_bytes
    layer_grads = lay.layer_trained * (lay.gathered_bytes if fsdp else g)
    cast = params.layer_matmul_parameters(m) * (dt.compute if lay.autocast else 0)
    below = m.num_layers - 1
    saved_casts = cast * (below if cfg.checkpointing == Checkpointing.NONE else 0)
    fp8_casts = _fp8_gradient_casts(ctx)
    common = {
        # FSDP: the top layer and the next one, prefetched (fsdp-grad-op: every layer, kept from forward)
        "gathered_parameters": gathered_bytes(ctx, Instant.TOP_LAYER_BACKWARD),
        "gradients": (params.root_parameters(m) - params.late_gradient_parameters(m)) * g,
    }
    moments = {
        "start": common | {
            "autocast_weight_copies": cast + saved_casts,
            "activations": (per_layer_forward_bytes(ctx) * below + layer_saved_bytes(ctx)
                            + mlp_backward_bytes(ctx) + adapter_backward_bytes(ctx) + fp8_casts) * T + tile_bytes(ctx),
        },
        "attention": common | {
            "gradients": common["gradients"] + _trained(ctx, params.layer_block_parameters(m, "mlp")
                                                        + params.output_projection_parameters(m))
            * (lay.gathered_bytes if fsdp else g),
            "autocast_weight_copies": saved_casts + (params.layer_block_parameters(m, "self_attn", matmul_only=True)
                                                     * (dt.compute if lay.autocast else 0)),
            "activations": (per_layer_forward_bytes(ctx) * below + _attention_backward(ctx)) * T,
        },
        "end": common | {
            "gradients": common["gradients"] + layer_grads,
            "autocast_weight_copies": saved_casts,
            "activations": (per_layer_forward_bytes(ctx) * below + 2 * dt.residual * m.hidden_size) * T,
        },
    }
    if tiled(ctx):  # the top layer's last tile, then its MLP norm's backward, with the MLP's gradients
        done = moments["start"]["gradients"] + _tiled_mlp_gradients(ctx, g)
        moments["last MLP tile"] = moments["start"] | {"gradients": done}
        moments["MLP norm"] = moments["start"] | {"gradients": done, "activations": (
            per_layer_forward_bytes(ctx) * below + _mlp_norm_backward(ctx)) * T}
    else:  # untiled, the MLP norm's backward follows the MLP's, whose gradients are made
        done = moments["start"]["gradients"] + _trained(ctx, params.layer_block_parameters(m, "mlp")) * (
            lay.gathered_bytes if fsdp else g)
        moments["MLP norm"] = moments["start"] | {"gradients": done, "autocast_weight_copies": saved_casts, "activations": (
            per_layer_forward_bytes(ctx) * below + _mlp_norm_backward(ctx)) * T}
    label = max(moments, key=lambda k: sum(moments[k].values()))
    return label, moments[label]


def _mlp_norm_backward(ctx: PlanContext) -> float:
    """Bytes per token of a layer at its MLP norm's backward: the attention half's saved tensors,
    the norm's own backward (``final_norm_backward_bytes``: RMSNorm's saved fp32 input and five
    fp32 temporaries of the width) and two residual-stream gradients (the branch's and the MLP
    input's). It can be the layer's largest moment where the MLP is narrow beside the width: tiled
    (traced: Qwen2.5-0.5B at 8,192 tokens), or split by tensor parallelism, which leaves the width
    whole (traced: a tiny Llama at TP 2 and 4 x FSDP2 2)."""
    m, dt, cfg = ctx.model, ctx.layout.dtypes, ctx.config
    attention = activations.total(activations.attention_saved(m, dt, ctx.layout.fused_attention, cfg.seq_len,
                                                              cfg.sequence_shards, cfg.heads_shards))
    return attention + activations.final_norm_backward_bytes(m, dt) + 2 * dt.residual * m.hidden_size


def _tiled_mlp_gradients(ctx: PlanContext, g: float) -> float:
    """Bytes of a layer's MLP weight gradients at its tiled backward's last tile (0 untiled): the
    tiles accumulate them in the weights' ``.grad`` (``g`` bytes each, the moment's gradient dtype),
    and under ZeRO, which otherwise hands each gradient to its buckets as it is made, DeepSpeed keeps
    them there until the last tile (``ds_grad_is_ready``), in the parameters' gradient dtype."""
    if not tiled(ctx):
        return 0.0
    g = g or (ctx.layout.grad_bytes if ctx.engine == Engine.DEEPSPEED else 0)
    return _trained(ctx, params.layer_block_parameters(ctx.model, "mlp")) * g


def _trained(ctx: PlanContext, elements: int) -> int:
    """Elements of a layer's block that have gradients: all of them, or with an adapter the
    layer's adapters (an upper bound for one block: a per-block split of the adapters is not worth
    its code, as they are ~1 % of the layer)."""
    return min(elements, ctx.layout.layer_trained) if ctx.layout.adapter else elements


def second_layer_backward(ctx: PlanContext) -> tuple[str, dict[str, float]]:
    """FSDP2: the second decoder layer from the top at its backward, bytes per term beyond the
    sharding buffers and the top layer's reduce-scatter input (in flight, a row of its own): the
    layer's own moments (``first_layer_backward``), every layer below it holding its saved tensors
    (fsdp-grad-op: and its unsharded parameters), and the top layer's sharded gradients. Traced:
    Mixtral 8x7B under FSDP2 peaks here, in the experts' weight gradients, as the input in flight
    (4 B per parameter of a 1.4 B-parameter layer) is twice what the top layer's saved tensors
    free at 8 x 1024 tokens.
    """
    m, lay, cfg = ctx.model, ctx.layout, ctx.config
    label, moment = first_layer_backward(ctx)
    below = per_layer_forward_bytes(ctx) * (m.num_layers - 2) * cfg.tokens_per_micro_batch
    done = lay.layer_trained * lay.grad_bytes / lay.shard_degree
    # fsdp-grad-op: the layers below still unsharded from forward (each reshards after its backward)
    return label, moment | {"activations": moment["activations"] + below, "gradients": moment["gradients"] + done,
                            "gathered_parameters": gathered_bytes(ctx, Instant.SECOND_LAYER_BACKWARD)}


def first_layer_backward(ctx: PlanContext) -> tuple[str, dict[str, float]]:
    """The largest moment of the first decoder layer's backward (the ledger's ``backward`` phase):
    bytes per term beyond the gradients made before it, the loss-side rows and the sharding buffers.

    Every checkpointing mode has the layer's full set of saved tensors at its backward (kept, or
    recomputed). Backward runs the MLP, then the attention. Three moments (T tokens; g gradient
    bytes; c compute bytes; casts: the layer's autocast weight casts, c per matmul weight, which
    the matmuls save; 0 without autocast):
    - start: every saved tensor of the layer, the MLP's gradient temporaries (fp8-mixed: and
      Float8Linear's cast of the widest output gradient, ``fp8_gradient_cast_bytes``), every cast;
    - last MLP weight gradient: the MLP's gradients (under autocast also the compute-dtype copy of
      the largest one before its fp32 upcast), the attention half's saved tensors, the pre-MLP norm
      and the MLP input, one intermediate gradient (c*f per routed expert; fused gate_up: the
      concatenated 2*c*f, ``params.fused_gate_up``), MoE: the experts' gathered input and its
      gradient (c*h per routed expert each; traced, Mixtral 8x7B under FSDP2) and two residual
      gradients, the attention casts and the largest MLP weight's;
    - attention backward: the MLP's and the output projection's gradients, the attention half's
      saved tensors and its gradient temporaries (eager: the softmax gradient), the attention casts.
    ZeRO-2/3: the layer's gradients go to the bucketed partitions (sharding buffers), so the moments
    hold none. FSDP: the layer's unsharded parameters (resharding: and one all-gather output held)
    and its unsharded gradients so far, in the parameters' dtype (FSDP2 reduce-scatters them when
    the layer's backward ends). The end of
    the layer's backward (all its gradients, little else) is below the embeddings' backward
    (``backward_end``). Checked by the traced probe (benchmarks/traced_matrix.py).
    """
    m, lay, cfg = ctx.model, ctx.layout, ctx.config
    dt, T, c, h = lay.dtypes, cfg.tokens_per_micro_batch, lay.dtypes.compute, ctx.model.hidden_size
    fsdp = ctx.engine == Engine.FSDP
    if fsdp:  # the layer's unsharded gradients, in the parameters' dtype, until its reduce-scatter
        g = lay.gathered_bytes
    else:  # (an adapter's gradients are the precision strategy's row over the whole backward)
        g = 0 if ctx.layout.gradients_sharded or cfg.grad_accum > 1 or lay.adapter else lay.grad_bytes
    cast = c if lay.autocast else 0
    # the layer computing, unsharded; resharding, also the prefetched layer's all-gather output held
    gathered = gathered_bytes(ctx, Instant.LAYER_BACKWARD)
    attention = activations.total(activations.attention_saved(m, dt, ctx.layout.fused_attention, cfg.seq_len,
                                                              ctx.config.sequence_shards, ctx.config.heads_shards))
    mlp_grads, big = _trained(ctx, params.layer_block_parameters(m, "mlp")), params.largest_mlp_matrix(m)
    attention_casts = params.layer_block_parameters(m, "self_attn", matmul_only=True) * cast
    intermediate = (2 if params.fused_gate_up(m) else 1) * c * m.intermediate_size * m.experts_per_token
    routed = 2 * c * h * m.experts_per_token if m.is_moe else 0  # the experts' input and its gradient
    mlp_side = activations.norm_bytes(m, dt) + c * h + intermediate + routed + 2 * dt.residual * h
    moments = {
        "start": {
            "gradients": 0,
            "autocast_weight_copies": params.layer_matmul_parameters(m) * cast,
            "activations": ((layer_saved_bytes(ctx) if lay.adapter
                             else attention + activations.total(activations.mlp_saved(m, dt, tiled(ctx))))
                            + mlp_backward_bytes(ctx) + adapter_backward_bytes(ctx)
                            + _fp8_gradient_casts(ctx)) * T + tile_bytes(ctx),
        },
        "last MLP weight gradient": {
            "gradients": mlp_grads * g + (big * cast if g else 0),
            "autocast_weight_copies": attention_casts + big * cast,
            "activations": (attention + mlp_side) * T,
        },
        "attention": {
            "gradients": (mlp_grads + _trained(ctx, params.output_projection_parameters(m))) * g,
            "autocast_weight_copies": attention_casts,
            "activations": _attention_backward(ctx) * T,
        },
    }
    if tiled(ctx):  # the last tile, then the MLP norm's backward, with the MLP's gradients
        moments["last MLP weight gradient"] = moments["start"] | {"gradients": _tiled_mlp_gradients(ctx, g)}
        moments["MLP norm"] = moments["last MLP weight gradient"] | {"activations": _mlp_norm_backward(ctx) * T}
    else:  # untiled, the MLP norm's backward follows the MLP's, whose gradients are made
        moments["MLP norm"] = {"gradients": mlp_grads * g, "autocast_weight_copies": attention_casts,
                               "activations": _mlp_norm_backward(ctx) * T}
    for moment in moments.values():
        moment["gathered_parameters"] = gathered
    label = max(moments, key=lambda k: sum(moments[k].values()))
    return label, moments[label]


def _time(ctx: PlanContext, ledger: LedgerDraft, paged: PagedInfo | None, draft: TimeDraft) -> None:
    """Elementwise traffic of the layers, and recomputation: full checkpointing runs every layer's
    forward again during backward (matmuls, attention, elementwise: ~33% more compute,
    Korthikanti et al. 2022); selective (SELECTIVE_POLICY) recomputes the elementwise ops and the
    matmuls whose outputs it did not keep (every second one: Llama's k, o and up projections;
    MoE experts), and eager attention's bmm (not in the policy's list); its per-op policy runs on
    the host in the forward and the recompute (``SELECTIVE_CHECKPOINT_SECONDS_PER_LAYER``: a
    dispatch floor)."""
    cfg, m = ctx.config, ctx.model
    saved = layer_saved_bytes(ctx)
    elementwise = rates.elementwise_forward_seconds(ctx, saved)
    draft.compute("elementwise", "norms, activations, RoPE, residuals (forward)", elementwise, Window.FORWARD)
    draft.compute("elementwise", "norms, activations, RoPE, residuals (backward)", 2 * elementwise, Window.BACKWARD)
    if cfg.checkpointing == Checkpointing.FULL:
        redo = rates.layer_matmul_forward_seconds(ctx) + rates.attention_forward_seconds(ctx) + elementwise
        draft.compute("recompute", "full recomputation: each layer's forward again", redo, Window.BACKWARD)
        # the recomputed forward is launched during the backward pass
        draft.dispatch(0.0, m.num_layers * overheads.layer_forward_dispatch_seconds(ctx.layout.fused_attention))
    elif cfg.checkpointing == Checkpointing.SELECTIVE:
        kept = activations.total(activations.layer_selective(m, ctx.layout.dtypes, ctx.layout.fused_attention, cfg.seq_len))
        _, recomputed = activations.selective_matmuls(m)
        redo = (rates.elementwise_forward_seconds(ctx, max(0.0, saved - kept))
                + rates.layer_matmul_forward_seconds(ctx, recomputed))
        what = "elementwise ops"
        if not ctx.layout.fused_attention:
            redo += rates.attention_forward_seconds(ctx)
            what += ", eager attention"
        names = ", ".join(dict.fromkeys(t.name.removesuffix(".weight").split(".")[-1] for t in recomputed))
        draft.compute("recompute", f"selective recomputation: {names}, {what}", redo, Window.BACKWARD,
                      note="every second matmul: 2 FLOPs/param/token")
        policy = m.num_layers * overheads.SELECTIVE_CHECKPOINT_SECONDS_PER_LAYER
        draft.dispatch(policy, policy, f"the selective policy's per-op dispatch "
                       f"({overheads.SELECTIVE_CHECKPOINT_SECONDS_PER_LAYER * 1e3:.1f} ms a layer, measured: H100, 16-CPU host)")


def _emit(ctx: PlanContext, files: EmitDraft) -> None:
    """Full: FSDP's own activation checkpointing under FSDP (the Trainer's would add a redundant
    all-gather, transformers issue #30404), else, and for a reentrant plan (FSDP's own is
    non-reentrant), HF gradient checkpointing in the plan's implementation (``use_reentrant``).
    Selective: no switch exists in
    accelerate or the Trainer; runtime.json names the policy, which the runtime applies to each
    decoder layer."""
    c = ctx.config.checkpointing
    reentrant = ctx.config.checkpoint_impl == CheckpointImpl.REENTRANT
    fsdp = fsdp_checkpoints(ctx)  # (FSDP's own wraps each layer non-reentrant)
    if c == Checkpointing.FULL and fsdp:
        files.fsdp()["fsdp_activation_checkpointing"] = True
        files.trainer_fsdp()["activation_checkpointing"] = True
    # transformers 5 names (gradient_checkpointing* are deprecated aliases, removed in v6)
    files.training_args["activation_checkpointing"] = c == Checkpointing.FULL and not fsdp
    if c == Checkpointing.FULL and not fsdp:
        files.training_args["activation_checkpointing_kwargs"] = {"use_reentrant": reentrant}
    if c == Checkpointing.SELECTIVE:
        files.runtime["checkpointing"] = str(c)


def _read(job: JobFiles, r: Reading) -> None:
    """The Trainer's gradient / activation checkpointing, FSDP's own activation checkpointing (both
    full), runtime.json's selective policy; DeepSpeed's activation_checkpointing is named as not
    modelled."""
    if job.runtime_where and job.runtime.get("checkpointing") is not None:
        policy = job.runtime["checkpointing"]
        if policy == Checkpointing.SELECTIVE:
            r.set("checkpointing", Checkpointing.SELECTIVE, f"{job.runtime_where}: checkpointing selective")
        else:
            r.problems.append(f"{job.runtime_where}: checkpointing {policy!r}: the runtime applies only 'selective'")
    for fsdp in job.fsdp:
        if fsdp.get("activation_checkpointing", False) in (True, "true"):
            r.set("checkpointing", Checkpointing.FULL, f"{fsdp.file}: FSDP activation checkpointing")
            r.set("checkpoint_impl", CheckpointImpl.NON_REENTRANT, f"{fsdp.file}: FSDP activation checkpointing "
                                                                   "(accelerate wraps each layer non-reentrant)")
    keys = ("gradient_checkpointing", "activation_checkpointing")
    if job.training_args_where:
        d, where = job.training_args, job.training_args_where
        on = next((k for k in keys if r.typed(d, k, (bool,), where, False)), None)
        if on is not None:
            r.set("checkpointing", Checkpointing.FULL, f"{where}: {on}")
            _read_impl(d, where, r)
        elif any(k in d for k in keys) and "checkpointing" not in r.values:  # off, and nothing else checkpoints
            r.set("checkpointing", Checkpointing.NONE, f"{where}: {next(k for k in keys if k in d)} off")
    if job.deepspeed_where and job.deepspeed.get("activation_checkpointing"):
        r.warnings.append(f"{job.deepspeed_where}: DeepSpeed's activation_checkpointing applies only through its own "
                          "API; not modelled")


def _read_impl(d: dict, where: str, r: Reading) -> None:
    """The Trainer's checkpoint implementation: ``use_reentrant`` in its checkpointing kwargs, or
    the installed transformers' default (``NON_REENTRANT_DEFAULT_SINCE``); planner's own without
    either."""
    for key in ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"):
        kwargs = r.section(d, key, where)
        if "use_reentrant" in kwargs:
            flag = r.typed(kwargs, "use_reentrant", (bool,), f"{where}: {key}")
            if isinstance(flag, bool):
                r.set("checkpoint_impl", CheckpointImpl.REENTRANT if flag else CheckpointImpl.NON_REENTRANT,
                      f"{where}: {key} use_reentrant {flag}")
            return
    tf = job_module.installed_release("transformers")
    if tf is not None:
        impl = CheckpointImpl.NON_REENTRANT if tf >= NON_REENTRANT_DEFAULT_SINCE else CheckpointImpl.REENTRANT
        r.set("checkpoint_impl", impl, f"no use_reentrant: transformers {tf[0]}.{tf[1]}'s default, installed here")


def _savers(c, hardware: HardwareSpec) -> list[tuple[str, dict]]:
    """More checkpointing; under full, the reentrant checkpoint (it saves only where a quantized
    base keeps its matmuls' inputs: the callers keep a change only where it lowers the peak)."""
    order = list(Checkpointing)
    out: list[tuple[str, dict]] = [(f"checkpointing {c.checkpointing} -> {t}", {"checkpointing": t})
           for t in (Checkpointing.SELECTIVE, Checkpointing.FULL) if order.index(t) > order.index(c.checkpointing)]
    if c.checkpointing == Checkpointing.FULL and c.checkpoint_impl == CheckpointImpl.NON_REENTRANT:
        out.append((f"checkpoint-impl {c.checkpoint_impl} -> {CheckpointImpl.REENTRANT}",
                    {"checkpoint_impl": CheckpointImpl.REENTRANT}))
    return out


STRATEGY = Strategy(
    "checkpointing", Checkpointing, Checkpointing.NONE, order=2, short="ckpt",
    help="activation checkpointing: none, selective (torchtitan per-op policy: saves attention and every other "
         "matmul output), full (each layer's input)",
    apply=_apply, time=_time, emit=_emit, read=_read, savers=_savers,
    runtime="planner.runtime.checkpointing", records=CHOICES, settings=SETTINGS,
)
