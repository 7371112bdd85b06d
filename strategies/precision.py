"""Mixed precision: which dtype each model state is stored in, and what the compute runs in.

Layouts (bytes per parameter; Psi = parameters). Sources: Micikevicius et al. 2018 "Mixed
Precision Training"; ZeRO paper (Rajbhandari et al. 2020) Sec. 3.1 (2+2+K bytes); torch.amp
(autocast keeps fp32 parameters and caches the low-precision casts of matmul weights until the
autocast region exits, and they are saved for backward); DeepSpeed bf16/fp16 (16-bit
parameters and gradients, fp32 master partition); FSDP2 MixedPrecisionPolicy (fp32 sharded
parameters gathered as bf16).

| precision  | engine          | weights | master | grads | residual stream |
| fp32       | any             | 4       | -      | 4     | 4               |
| *-mixed    | torch (autocast)| 4       | (= weights) | 4 | 4               |
| *-mixed    | deepspeed       | 2       | 4      | 2     | 2               |
| *-mixed    | fsdp            | 4 (sharded) | (= weights) | 4 | 2           |
| bf16-pure  | torch / fsdp    | 2       | -      | 2     | 2               |

fp8-mixed is bf16-mixed whose matmuls run in fp8 (torchao Float8Linear / Transformer Engine):
memory as bf16-mixed plus one layer's fp8 weight casts; it is a speed knob (DESIGN.md).
"""

from dataclasses import dataclass
from enum import StrEnum
from functools import cache

from planner.core import job as job_module
from planner.core.emitted import EmitDraft
from planner.core.job import JobFiles, Reading
from planner.core.ledger import ALL_PHASES, LedgerDraft, PagedInfo, Phase
from planner.core.numerics import Rung
from planner.core.timing import TimeDraft, Window
from planner.core.units import DTYPE_BYTES
from planner.cost import params
from planner.cost.activations import DTypes
from planner.strategies import rates
from planner.strategies.base import Check, Choice, Engine, PlanContext, Strategy
from planner.strategies.checkpointing import Checkpointing, backward_peak
from planner.strategies.fsdp_units import outer_units


class Precision(StrEnum):
    FP32 = "fp32"
    FP16_MIXED = "fp16-mixed"
    BF16_MIXED = "bf16-mixed"  # fp32 master weights and optimizer states, bf16 compute
    BF16_PURE = "bf16-pure"  # bf16 weights, gradients and optimizer states
    FP8_MIXED = "fp8-mixed"  # bf16-mixed with fp8 matmuls


#: The rungs of the numerics ladder precision's choices sit on (planner/core/numerics.py).
FP8 = Rung("fp8", 2.0, "fp8 matmuls", source=(
    "torchao Float8Linear, tensor-wise dynamic scaling: loss curves matching bf16 on Llama-3 8B/70B "
    "pre-training in torchtitan's published runs (PyTorch blog, \"Supercharging training using float8 and "
    "FSDP2\", 2024), but the least precision of any exact-looking choice: outliers in activations can "
    "diverge (Fishman et al. 2024, \"Scaling FP8 training to trillion-token LLMs\")"))
BF16_WEIGHTS = Rung("bf16-weights", 4.0, "bf16 weights without an fp32 master copy", source=(
    "updates below bf16's resolution (8 bits of mantissa) are rounded away; Zamirai et al. 2020, "
    "\"Revisiting BFloat16 Training\", measure a quality gap without stochastic rounding or Kahan summation"))


@dataclass(frozen=True)
class PrecisionChoice(Choice):
    """One precision value (a ``Choice``) and the dtypes every layer reads of it: ``compute``, the
    dtype of the matmuls outside fp8 layers and of MFU's peak (torch keeps fp32 matmuls in fp32:
    TF32 is off by default since torch 1.12); ``layer_matmul``, the decoder layers' linears (fp8
    under fp8-mixed: torchao converts them, not the output head); ``accelerate``, accelerate's
    ``mixed_precision``; ``load``, the parameters' dtype as loaded (runtime.json ``dtype``; with an
    adapter the frozen base loads in the compute dtype instead); ``mixed``: autocast over fp32
    parameters."""

    compute: str
    layer_matmul: str
    accelerate: str
    load: str
    mixed: bool


#: Every precision value, in vocabulary order. fp16 needs dynamic loss scaling (overflows skip
#: steps), bf16 has fp32's range: fp16-mixed adds complexity; bf16-pure is the runtime's (it loads
#: the weights in bf16: runtime.json, no standard key).
CHOICES: dict[Precision, PrecisionChoice] = {
    Precision.FP32: PrecisionChoice("fp32 weights, gradients and matmuls", "fp32", "fp32", "no", "float32", False),
    Precision.FP16_MIXED: PrecisionChoice("fp16 autocast over fp32 weights, dynamic loss scaling", "fp16", "fp16",
                                          "fp16", "float32", True, complexity=1),
    Precision.BF16_MIXED: PrecisionChoice("bf16 autocast over fp32 weights and optimizer states", "bf16", "bf16",
                                          "bf16", "float32", True),
    Precision.BF16_PURE: PrecisionChoice("bf16 weights, gradients and states, no fp32 master", "bf16", "bf16",
                                         "no", "bfloat16", False, rung=BF16_WEIGHTS, complexity=1, runtime_only=True),
    Precision.FP8_MIXED: PrecisionChoice("bf16-mixed with the decoder layers' matmuls in fp8 (torchao)", "bf16", "fp8",
                                         "fp8", "float32", True, rung=FP8, complexity=1),
}
MIXED = tuple(p for p, c in CHOICES.items() if c.mixed)
SIXTEEN_BIT_MIXED = (Precision.BF16_MIXED, Precision.FP16_MIXED)  # the same states, speed and memory
COMPUTE_DTYPE = {p: c.compute for p, c in CHOICES.items()}
LAYER_MATMUL_DTYPE = {p: c.layer_matmul for p, c in CHOICES.items()}


def _storage(ctx: PlanContext, decided: dict) -> dict:
    """The dtype of each tensor class (the table in the module docstring), for the engine the
    sharding strategy chose. FSDP2 reduces gradients in its MixedPrecisionPolicy reduce_dtype: fp32
    for the mixed precisions planner emits, else the parameters' own dtype: the gradients' dtype."""
    p = ctx.config.precision
    weight, master, grad, state, dtypes, autocast, gathered = _dtypes(p, decided["engine"])
    frozen = 0
    if decided.get("frozen_parameters"):  # an adapter trains; the base is frozen
        weight, master, grad, state, dtypes, autocast, frozen = _adapter_dtypes(p, decided["engine"], _fp32_asked(ctx.config))
        spec = decided.get("adapter")
        if spec is not None and spec.fp32_norms:  # a k-bit prepared base: its fp32 norms make the residual fp32
            dtypes = DTypes(dtypes.compute, 4)
    # FSDP-QLoRA reduces in the quant storage dtype: the Trainer sets FSDP's mixed precision to it
    # (transformers ``update_fsdp_plugin_peft``)
    qlora_fsdp = decided.get("adapter") is not None and decided["adapter"].nf4 and decided["engine"] == Engine.FSDP
    return {"weight_bytes": weight, "master_bytes": master, "grad_bytes": grad, "state_bytes": state,
            "gathered_bytes": gathered, "reduce_bytes": gathered if qlora_fsdp else grad, "dtypes": dtypes,
            "autocast": autocast, "compute_dtype": COMPUTE_DTYPE[p], "layer_matmul_dtype": LAYER_MATMUL_DTYPE[p],
            "frozen_bytes": frozen, "adapter_copy_bytes": dtypes.compute if CHOICES[p].mixed else weight}


def _fp32_asked(config) -> bool:
    """Whether the plan asks for fp32 adapters (the adapter strategy's ``adapter_dtype``)."""
    return str(getattr(config, "adapter_dtype", "auto")) == "fp32"


def _adapter_dtypes(p: Precision, engine: Engine, fp32: bool = False) -> tuple:
    """(adapter weights, master, adapter gradients, states, activation dtypes, autocast of the
    base's weights, frozen base bytes) when an adapter trains on a frozen base.

    The frozen base loads in the compute dtype (nothing to update, so no fp32 copy: 16 bit, or
    fp32 under fp32). The adapters are laid out as FSDP2 lays out trained parameters on every
    engine but DeepSpeed: fp32 under the mixed precisions (peft ``autocast_adapter_dtype``;
    accelerate's ``fsdp2_prepare_model`` upcasts only trainable parameters), a 16-bit residual
    stream (the embeddings' output), no autocast of the base; bf16-pure and fp32 keep their own
    dtype. DeepSpeed casts every parameter, the adapters included, to 16 bit
    (``DeepSpeedEngine._configure_distributed_model``) and keeps fp32 masters of the trained ones
    in its optimizer: its own layout. ``fp32`` (the plan's ``adapter_dtype``) under bf16-pure off
    DeepSpeed: peft's default ``autocast_adapter_dtype``, fp32 adapters, gradients and states over
    16-bit activations, no autocast. Traced on real peft layers (tests/test_adapters.py)."""
    if fp32 and p == Precision.BF16_PURE and engine != Engine.DEEPSPEED:
        return 4, 0, 4, 4, DTypes(2, 2), False, 2
    basis = Engine.DEEPSPEED if engine == Engine.DEEPSPEED else Engine.FSDP
    weight, master, grad, state, dtypes, _, _ = _dtypes(p, basis)
    return weight, master, grad, state, dtypes, False, 4 if p == Precision.FP32 else 2


def fp32_adapters(p: Precision, engine: Engine, config=None) -> bool:
    """Whether a plan's adapters are fp32 parameters beside a 16-bit frozen base (``_adapter_dtypes``;
    ``config``: the plan, whose ``adapter_dtype`` may ask for them under bf16-pure); the launch
    creates them so (peft ``autocast_adapter_dtype``), and 16-bit under DeepSpeed, whose ZeRO-3
    does not cast a partitioned base and would keep fp32 adapters beside it."""
    return p != Precision.FP32 and _adapter_dtypes(p, engine, _fp32_asked(config))[0] == 4


@cache
def _dtypes(p: Precision, engine: Engine) -> tuple:
    """(weights, master, gradients, states, activation dtypes, autocast, gathered) for a precision
    under an engine: bytes per element."""
    if p == Precision.FP32:
        return 4, 0, 4, 4, DTypes(4, 4), False, 4
    if p == Precision.BF16_PURE:
        return 2, 0, 2, 2, DTypes(2, 2), False, 2
    if engine == Engine.DEEPSPEED:
        return 2, 4, 2, 4, DTypes(2, 2), False, 2
    if engine == Engine.FSDP:
        return 4, 0, 4, 4, DTypes(2, 2), False, 2
    return 4, 0, 4, 4, DTypes(2, 4), True, 2


def head_parameters(m) -> int:
    """Elements of the output head's weight (the embedding's when tied) one rank holds."""
    return m.vocab_rows * m.hidden_size


def autocast_layer_parameters(ctx: PlanContext) -> int:
    """Elements of the decoder layers' matmul weights that autocast casts to 16 bit and caches.

    All of them in bf16/fp16-mixed; under fp8-mixed only those Float8Linear does not replace
    (``fp8_converted``), plus the model's first Linear, which accelerate leaves in high precision
    (``find_first_last_linear_layers``: layer 0's first projection). Float8Linear casts its weight
    to fp8 per matmul and saves the fp32 parameter itself, not a copy."""
    m = ctx.model
    if ctx.config.precision != Precision.FP8_MIXED:
        return params.matmul_parameters(m) - head_parameters(m)
    layer = params.layer_matmuls(m)
    kept = sum(t.numel for t in layer if not params.fp8_converted(m, t)) * m.num_layers
    first = layer[0]
    return kept + (first.numel if params.fp8_converted(m, first) else 0)


def cache_only_casts(ctx: PlanContext) -> int:
    """Bytes of autocast weight casts alive only while the autocast region runs (the layers' casts
    when checkpointing recomputes them), excluding the head's."""
    lay = ctx.layout
    if not lay.autocast or ctx.config.checkpointing == Checkpointing.NONE:
        return 0
    return autocast_layer_parameters(ctx) * lay.dtypes.compute


def grads_in_forward(ctx: PlanContext) -> frozenset[Phase]:
    """Gradients exist from the first backward on; with accumulation they persist across
    micro-batches, so they are resident in the forward phase too, except under FSDP reducing once
    per step (``gradient_sync`` step), whose sharded gradients come from the last micro-batch's
    reduce-scatter (the unsharded ones it accumulates until then are strategies/fsdp_memory.py's
    row). DeepSpeed ZeRO-3 allocates its
    flat gradient-partition buffer when the engine is built (deepspeed/runtime/zero/stage3.py
    ``grad_partitions_flat_buffer``, 0.19.8), so its gradients are resident in every phase:
    measured on an H100, ZeRO-3's forward and backward peaks sat 2.31 GiB above ZeRO-2's, its
    bf16 gradient partition (Llama-3.2-1B, one rank; benchmarks/results/H100-SXM-80/2026-11-26)."""
    if (ctx.config.grad_accum > 1 and not ctx.fsdp_defers_reduction) or ctx.config.sharding == "zero3":
        return ALL_PHASES
    return frozenset({Phase.BACKWARD_END, Phase.STEP})


def gradients_before_first_layer(ctx: PlanContext) -> tuple[int, int] | None:
    """(elements, bytes per element) of the gradients made before the first decoder layer's backward
    (the head's and the layers' above the first), a row of the backward phase at the first layer's
    backward; None where the gradients row covers the backward whole (accumulating, ZeRO-3, an
    adapter) or DeepSpeed keeps them in its host partition."""
    lay = ctx.layout
    if lay.gradients_in_host_partition or lay.adapter or Phase.BACKWARD in grads_in_forward(ctx):
        return None
    elements = lay.trainable_parameters - late_gradient_parameters(ctx) - params.layer_parameters(ctx.model)
    return elements, lay.grad_bytes


def late_gradient_parameters(ctx: PlanContext) -> int:
    """Elements whose gradients appear only after every decoder layer's backward: the input
    embeddings' (planner.cost.params.late_gradient_parameters); under FSDP the last unit's, which
    FSDP2 reduce-scatters when its backward ends (strategies/fsdp_units.py: accelerate's root unit,
    embeddings, final norm and head)."""
    if ctx.engine == Engine.FSDP:
        return outer_units(ctx).last_unit
    return params.late_gradient_parameters(ctx.model)


def moe_autocast_reason(p: str) -> str:
    """Why a MoE model is not offered under autocast over fp32 parameters (a mixed precision
    with plain torch or DDP; FSDP2 and DeepSpeed hand the experts 16-bit parameters instead).

    transformers 5 runs routed experts as ``grouped_mm`` over fused ``gate_up_proj``/``down_proj``
    tensors (the default ``experts_implementation``, modeling_utils
    ``get_correct_experts_implementation``). ``torch.nn.functional.grouped_mm`` has no autocast
    rule (pytorch#174763), so transformers casts the input to the weights' dtype
    (integrations/moe.py ``_grouped_mm``): with fp32 weights the experts, most of the model's
    FLOPs, compute in fp32. On CUDA that is not the bf16 CUTLASS kernel but the per-expert
    ``mm`` fallback (aten/native/cuda/GroupedBlas.cpp: the fast path needs bf16 operands), and
    torch's meta kernel refuses it outright (``_meta_grouped_mm``: "Expected inputs of BF16
    type"), so neither the memory nor the step time the plan would promise holds.
    """
    return (f"{p} over fp32 parameters: transformers' grouped_mm experts have no autocast and would "
            "compute in fp32 (CUDA's per-expert fallback, not the bf16 kernel); use fsdp or a ZeRO "
            "stage (16-bit parameters), or bf16-pure")


def _check(ctx: PlanContext, out: Check) -> None:
    p, gpu = ctx.config.precision, ctx.hardware.gpu
    if p in (Precision.BF16_MIXED, Precision.BF16_PURE, Precision.FP8_MIXED) and not gpu.supports("bf16"):
        out.reject(
            "bf16 on a GPU without bf16",
            f"{p}: {gpu.id} ({gpu.architecture}) has no bf16 support (needs compute capability 8.0+); use fp16-mixed or fp32"
        )
    if p == Precision.FP8_MIXED and not gpu.supports("fp8"):
        out.reject(
            "fp8 on a GPU without fp8",
            f"fp8-mixed: {gpu.id} ({gpu.architecture}) has no fp8 tensor cores "
            "(needs Ada, Hopper, Blackwell or MI300); use bf16-mixed"
        )
    if p == Precision.BF16_PURE and ctx.engine == Engine.DEEPSPEED:
        out.reject(
            "bf16-pure under DeepSpeed",
            "bf16-pure with DeepSpeed ZeRO: DeepSpeed always keeps fp32 master weights with bf16; "
            "use bf16-mixed, or fsdp for bf16-pure"
        )
    if p == Precision.FP8_MIXED and ctx.engine == Engine.DEEPSPEED:
        out.reject(
            "fp8 under DeepSpeed",
            "fp8-mixed with DeepSpeed ZeRO: accelerate applies fp8 only from its own mixed_precision setting, which it "
            "refuses next to a DeepSpeed config file; use fsdp (torchao fp8) or bf16-mixed with ZeRO",
        )
    if ctx.model.is_moe and ctx.layout.dtypes.upcast:
        out.reject("MoE experts under autocast", moe_autocast_reason(p))
    if p == Precision.FP16_MIXED and gpu.supports("bf16"):
        out.warnings.append("fp16-mixed needs loss scaling and can overflow; bf16-mixed is safer on this GPU")
    if p == Precision.BF16_PURE:
        # bf16 keeps 8 significant bits: a weight's rounding step is 2^-8 of it, and an update below
        # half of that is rounded away (Zamirai et al. 2020, "Revisiting BFloat16 Training": pure
        # bf16 loses accuracy without stochastic rounding or Kahan summation)
        out.warnings.append("bf16-pure keeps weights, gradients and optimizer states in bf16 with no fp32 master "
                            "copy: an update under ~0.2 % of its weight is rounded away, so small learning rates "
                            "stall; an approximation of mixed precision, the riskiest rung of the numerics ladder")


def _apply(ctx: PlanContext, ledger: LedgerDraft) -> None:
    m, lay = ctx.model, ctx.layout
    trainable = lay.trainable_parameters
    wdt = {4: "fp32", 2: "16-bit"}[lay.weight_bytes]
    what = "adapter weights" if lay.adapter else "weights"  # (the adapter strategy writes the frozen base's)
    ledger.add("weights", f"{what} ({wdt})", trainable, lay.weight_bytes, place=lay.placement("weights"),
               note=f"{trainable:,} params x {lay.weight_bytes} B")
    if lay.master_bytes:
        ledger.add("master_weights", "master weights (fp32)", trainable, lay.master_bytes,
                   place=lay.placement("master_weights"), note=f"{trainable:,} params x 4 B")
    if not lay.gradients_in_host_partition:
        _gradient_rows(ctx, ledger)
    if lay.autocast:
        # torch.amp caches the 16-bit cast of every matmul weight until the autocast region (the
        # model forward and the loss) exits; the matmuls save them for backward, so without
        # checkpointing they outlive it. The head's cast and the casts that live only in the cache
        # belong to the loss's moments (strategies/loss.py); the first layer's, to its backward's
        # moments (strategies/checkpointing.py).
        if ctx.config.checkpointing == Checkpointing.NONE:
            ledger.add(
                "autocast_weight_copies", "autocast casts of the layers' matmul weights (saved for backward)",
                autocast_layer_parameters(ctx), lay.dtypes.compute, phases=frozenset({Phase.FORWARD}),
                note="torch.amp weight casts, saved by the matmuls that use them",
            )
    if ctx.config.precision == Precision.FP8_MIXED:
        ledger.add(
            "autocast_weight_copies", "fp8 casts of one layer's weights", params.layer_matmul_parameters(m), 1,
            phases=frozenset({Phase.FORWARD, Phase.BACKWARD}), note="Float8Linear casts weights per matmul",
        )


def _gradient_rows(ctx: PlanContext, ledger: LedgerDraft) -> None:
    """The trained parameters' gradients, phase by phase: all of them from the first micro-batch on
    when accumulating; else those made before the first layer's backward, the decoder layers'
    before the root unit's reduce-scatter (FSDP), and every one for the step."""
    lay = ctx.layout
    trainable, place = lay.trainable_parameters, lay.placement("gradients")
    gdt = {4: "fp32", 2: "16-bit"}[lay.grad_bytes]
    phases = grads_in_forward(ctx)
    if lay.adapter:  # the adapters' gradients, all counted from the top layer's backward on (a small upper bound)
        phases = phases | {Phase.BACKWARD}
    elif Phase.BACKWARD not in phases:  # (accumulating: every gradient exists from the first micro-batch on)
        late = late_gradient_parameters(ctx)
        before = gradients_before_first_layer(ctx)
        if before and backward_peak(ctx).gradients_before:
            ledger.add("gradients", f"gradients ({gdt}) made before the first layer's backward", *before,
                       phases=frozenset({Phase.BACKWARD}), place=place, note="the head's and the layers' above the first")
        if ctx.engine == Engine.FSDP:  # the root unit's sharded gradients come from its reduce-scatter, last
            ledger.add("gradients", f"gradients ({gdt}) of the decoder layers", trainable - late, lay.grad_bytes,
                       phases=frozenset({Phase.BACKWARD_END}), place=place, note="before the root unit's reduce-scatter")
            phases = phases - {Phase.BACKWARD_END}
    ledger.add("gradients", f"{'adapter ' if lay.adapter else ''}gradients ({gdt})", trainable, lay.grad_bytes, phases=phases,
               place=place, note=f"{trainable:,} params x {lay.grad_bytes} B")


def matmul_seconds(ctx: PlanContext) -> tuple[float, float]:
    """The model's matmuls per micro-batch, (forward, backward): the forward's layer and head matmuls
    (``rates``; 2 FLOPs per parameter per token), the backward's input gradients as many again and,
    unless the base is frozen under an adapter, the weight gradients as many more (the 6N rule,
    Kaplan et al. 2020). Unit: seconds."""
    fwd = rates.layer_matmul_forward_seconds(ctx) + rates.head_matmul_forward_seconds(ctx)
    return fwd, fwd if ctx.layout.adapter else 2 * fwd


def _time(ctx: PlanContext, ledger: LedgerDraft, paged: PagedInfo | None, draft: TimeDraft) -> None:
    """The matmuls (6N rule: ``matmul_seconds``), and under autocast the casts of the weights it makes: every matmul
    weight read in its stored dtype and written in the compute dtype once per micro-batch (torch
    autocast caches a leaf weight's cast until its region exits), again for the layers a full
    checkpoint recomputes (the recompute enters autocast afresh), and the cast's backward turning
    each weight gradient back into the weight's dtype. Memory bound. Unit: seconds per micro-batch.
    Source: torch autocast (``cached_cast``; its cache is cleared on leaving the outermost region)."""
    lay, m = ctx.layout, ctx.model
    fwd, bwd = matmul_seconds(ctx)
    dtype = "fp8 layers" if ctx.config.precision == Precision.FP8_MIXED else lay.compute_dtype
    draft.compute("matmul", f"forward matmuls ({dtype})", fwd, Window.FORWARD, note="6N rule: 2 FLOPs/param/token")
    # (a frozen base under an adapter: input gradients only; the adapter strategy times the adapters)
    draft.compute("matmul", f"backward matmuls ({dtype})", bwd, Window.BACKWARD,
                  note="input gradients only (frozen)" if lay.adapter else "input and weight gradients")
    if not lay.autocast or lay.weight_bytes == DTYPE_BYTES[lay.compute_dtype]:
        return
    per = (lay.weight_bytes + DTYPE_BYTES[lay.compute_dtype]) / rates.bandwidth(ctx)
    weights = params.matmul_parameters(m) * per
    draft.compute("elementwise", f"autocast: matmul weights cast to {lay.compute_dtype}", weights, Window.FORWARD)
    redo = params.layer_matmul_parameters(m) * m.num_layers * per if ctx.config.checkpointing == Checkpointing.FULL else 0.0
    back = 0.0 if lay.adapter else weights
    if redo or back:
        draft.compute("elementwise", "autocast: " + " and ".join(
            w for w, on in (("the recompute's casts", redo), ("weight gradients cast back", back)) if on),
            redo + back, Window.BACKWARD)


def _emit(ctx: PlanContext, files: EmitDraft) -> None:
    """accelerate mixed_precision (fp8 through torchao; none next to a DeepSpeed file, whose
    bf16/fp16 sections decide), DeepSpeed's bf16/fp16 sections (fp16 with dynamic loss scaling),
    the Trainer's bf16/fp16 flags, the weights' load dtype (runtime.json) and, for fp8, torch.compile.

    fp8: the Trainer's bf16 and fp16 stay off, so the Trainer takes the mixed precision accelerate
    launch exports from the YAML (``ACCELERATE_MIXED_PRECISION=fp8``; transformers
    TrainingArguments.__post_init__: bf16 / fp16 override the environment, else it is used);
    ``bf16: true`` would hand accelerate bf16 and drop fp8. The fp8 speed-up assumes the casts and
    scales are fused by torch.compile (torchao's float8 README trains compiled), so the launch
    compiles (the Trainer's torch_compile)."""
    p = ctx.config.precision
    if files.deepspeed is None:  # with a DeepSpeed file, its bf16 / fp16 sections decide (accelerate rule)
        files.accelerate["mixed_precision"] = CHOICES[p].accelerate
    if p == Precision.FP8_MIXED:
        files.accelerate["fp8_config"] = {"backend": "AO"}
        files.training_args["torch_compile"] = True
        files.extras.add("torchao")
    if files.deepspeed is not None:
        if p == Precision.BF16_MIXED:
            files.deepspeed["bf16"] = {"enabled": True}
        elif p == Precision.FP16_MIXED:
            files.deepspeed["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16,
                                       "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1}
    files.training_args["bf16"] = p == Precision.BF16_MIXED
    files.training_args["fp16"] = p == Precision.FP16_MIXED
    files.runtime["dtype"] = load_dtype(p, ctx.layout.adapter is not None)


#: torch's names of the compute dtypes.
TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def load_dtype(p: Precision, adapter: bool) -> str:
    """The dtype the model's parameters load in (a torch dtype's name): the record's; with an
    adapter the frozen base loads in the compute dtype (``_adapter_dtypes``)."""
    return TORCH_DTYPE[CHOICES[p].compute] if adapter else CHOICES[p].load


#: "Not mixed": accelerate's mixed_precision "no", or the Trainer with bf16 and fp16 off: fp32
#: weights, or bf16-pure when the model is loaded in bf16 (which no job file says; plan.json does).
NOT_MIXED = "not mixed"
#: A reading that a more specific one refines rather than contradicts: "not mixed" is fp32 or
#: bf16-pure; the Trainer's bf16 flag next to accelerate's fp8 is an fp8 job (bf16 outside the
#: fp8 matmuls).
#: accelerate's "no" beside the Trainer's bf16 / fp16 flag is the Trainer's mixed precision (its flags
#: override the environment accelerate launch exports: TrainingArguments.__post_init__).
REFINES = {NOT_MIXED: {Precision.FP32, Precision.BF16_PURE, Precision.BF16_MIXED, Precision.FP16_MIXED},
           Precision.BF16_MIXED: {Precision.FP8_MIXED}}
ACCELERATE_READS = {"no": NOT_MIXED} | {c.accelerate: p for p, c in CHOICES.items() if c.accelerate != "no"}


def _read(job: JobFiles, r: Reading) -> None:
    """accelerate's mixed_precision (unless a DeepSpeed JSON decides), its fp8 backend, DeepSpeed's
    bf16 / fp16 sections, the Trainer's bf16 / fp16 flags."""
    if job.accelerate:
        where = f"{job.accelerate_where}: mixed_precision"
        mp = r.typed(job.accelerate, "mixed_precision", (str,), job.accelerate_where, "no")
        if job.accelerate_precision_applies and mp is not None:
            # accelerate's launch lowercases it (utils/launch.py: PrecisionType(mixed_precision.lower()))
            if str(mp).lower() not in ACCELERATE_READS:
                r.problems.append(f"{where}: mixed_precision {mp!r} is not one of {', '.join(ACCELERATE_READS)}")
            else:
                r.set("precision", ACCELERATE_READS[str(mp).lower()], where, REFINES)
        fp8 = r.section(job.accelerate, "fp8_config", job.accelerate_where)
        if str(fp8.get("backend", "AO")).upper() != "AO":
            r.warnings.append(f"{job.accelerate_where}: fp8 backend {fp8.get('backend')} is modelled as torchao fp8")
    if job.deepspeed_where:
        ds, where = job.deepspeed, job.deepspeed_where
        bf_key = "bf16" if "bf16" in ds or "bfloat16" not in ds else "bfloat16"  # (DeepSpeed's legacy alias)
        bf16 = r.typed(r.section(ds, bf_key, where), "enabled", (bool,), f"{where}: {bf_key}", False, allow_auto=True)
        fp16 = r.typed(r.section(ds, "fp16", where), "enabled", (bool,), f"{where}: fp16", False, allow_auto=True)
        auto = "auto" in (r.section(ds, bf_key, where).get("enabled"), r.section(ds, "fp16", where).get("enabled"))
        if bf16 and fp16:
            r.problems.append(f"contradiction: {where} enables both bf16 and fp16")
        elif bf16 or fp16:
            r.set("precision", Precision.BF16_MIXED if bf16 else Precision.FP16_MIXED,
                  f"{where}: {bf_key if bf16 else 'fp16'}.enabled", REFINES)
        elif not auto:  # DeepSpeed trains in fp32 unless a section enables 16 bit; accelerate adds one for
            # its own bf16 / fp16 (the Trainer's flags), so this is "not mixed", which they refine
            r.set("precision", NOT_MIXED, f"{where}: neither bf16 nor fp16 enabled", REFINES)
    if job.training_args_where:
        d, where = job.training_args, job.training_args_where
        bf16, fp16 = (r.typed(d, k, (bool,), where, False) for k in ("bf16", "fp16"))
        pure = _bf16_weights_trained(job, r)
        if bf16 and fp16:
            r.problems.append(f"contradiction: {where} sets both bf16 and fp16")
        elif pure and not fp16:
            r.set("precision", Precision.BF16_PURE, f"{where}: {pure}", REFINES)
        elif bf16 or fp16:
            r.set("precision", Precision.BF16_MIXED if bf16 else Precision.FP16_MIXED,
                  f"{where}: {'bf16' if bf16 else 'fp16'}", REFINES)
        elif ("bf16" in d or "fp16" in d) and not job.accelerate:
            # with both off the Trainer takes accelerate launch's mixed precision, when there is one
            r.set("precision", NOT_MIXED, f"{where}: bf16 and fp16 off", REFINES)
        if said := _unsaid_load_dtype(job) or _fp32_frozen_base(job):
            r.warnings.append(said)
        if job.accelerate and r.values.get("precision", (None,))[0] == Precision.FP8_MIXED and not d.get("torch_compile"):
            r.time_as["precision"] = Precision.BF16_MIXED
            r.warnings.append(f"{where}: fp8 without torch_compile runs torchao's casts eagerly, slower than bf16 "
                              "(pytorch/ao#685); its step time is bf16-mixed's, a lower bound")
    if job.runtime_where:
        _read_load_dtype(job, r)


#: A recipe's load dtype (TRL ModelConfig ``torch_dtype``, renamed ``dtype`` in TRL 0.22).
LOAD_DTYPE_KEYS = ("torch_dtype", "dtype")


def _no_master_engine(job: JobFiles) -> bool:
    """Whether nothing in the job keeps fp32 master weights of its own: no DeepSpeed (its bf16 keeps
    fp32 partitions), no FSDP (accelerate upcasts trainable parameters under mixed precision), no
    adapter (peft keeps the adapters fp32); axolotl's own FSDP2 preparation does not upcast."""
    d = job.training_args
    fsdp = bool(job.fsdp) or job.distributed_type == "FSDP"
    if job.framework == "axolotl" and fsdp and all(f.version == 2 for f in job.fsdp):
        fsdp = False  # axolotl's own fsdp2_prepare_model keeps the bf16 parameters
    return not (job.deepspeed_where or fsdp or job.distributed_type == "DEEPSPEED" or d.get("use_peft"))


def _unsaid_load_dtype(job: JobFiles) -> str | None:
    """The assumption a recipe without a load dtype leaves to planner, said (None: it names one,
    or planner's own runtime.json does, or an engine keeps fp32 masters whatever the load)."""
    d = job.training_args
    if job.runtime_where or any(k in d for k in LOAD_DTYPE_KEYS) or not _no_master_engine(job):
        return None
    return (f"{job.training_args_where}: no torch_dtype / dtype: planned with fp32 weights, as "
            "transformers 4 loads them; transformers >= 5 loads a checkpoint in its stored "
            "dtype by default (dtype='auto', bfloat16 for most), and then this job trains bf16 weights and "
            "states with no fp32 master (bf16-pure, less memory, an approximation): set the dtype in the "
            "recipe, or check the other case with --precision bf16-pure")


#: transformers loads a checkpoint in its stored dtype when none is given from 5.0 (``dtype="auto"``
#: by default); before, in fp32 (``torch_dtype=None``), except a bitsandbytes-quantized base, whose
#: unquantized modules it loads in fp16 ("Overriding torch_dtype=None with torch_dtype=torch.float16
#: due to requirements of bitsandbytes").
STORED_DTYPE_SINCE = (5, 0)
#: TRL's ModelConfig ``dtype`` (``torch_dtype`` before 0.25) defaults to None up to 0.26 and to
#: "float32" from 0.27 (trl 4d52e02, #4778).
TRL_FP32_DEFAULT_SINCE = (0, 27)


def _fp32_frozen_base(job: JobFiles) -> str | None:
    """The warning for a TRL LoRA recipe (``use_peft``, no 4- or 8-bit base) with no load dtype
    whose frozen base then loads in fp32: TRL from 0.27 asks for float32, and before it passes
    None, which transformers before 5 loads in fp32. An fp32 base takes 4 bytes per parameter and,
    under autocast, an fp32 residual stream, where planner plans the base in the compute dtype, as
    its own launch loads it. None where the recipe names a dtype, or the TRL and transformers
    installed here load the stored dtype (TRL before 0.27 with transformers 5), and for
    LLaMA-Factory's and axolotl's recipes, whose loaders pass their compute dtype."""
    d = job.training_args
    if (job.runtime_where or job.framework or not d.get("use_peft") or any(k in d for k in LOAD_DTYPE_KEYS)
            or d.get("load_in_4bit") or d.get("load_in_8bit")):
        return None  # (LLaMA-Factory and axolotl load in their own compute dtype)
    trl, tf = job_module.installed_release("trl"), job_module.installed_release("transformers")
    if trl is not None and trl < TRL_FP32_DEFAULT_SINCE and tf is not None and tf >= STORED_DTYPE_SINCE:
        return None
    if trl is not None and trl >= TRL_FP32_DEFAULT_SINCE:
        which = f"TRL {trl[0]}.{trl[1]} (installed here) asks for fp32"
    elif tf is not None and tf < STORED_DTYPE_SINCE:
        which = f"transformers {tf[0]}.{tf[1]} (installed here) loads TRL's dtype None in fp32"
    elif tf is not None:  # TRL not installed here: the release that runs the job decides
        which = "TRL from 0.27 asks for fp32; TRL is not installed here"
    else:
        which = "TRL from 0.27, and transformers before 5, load it in fp32"
    return (f"{job.training_args_where}: use_peft with no dtype: the frozen base may be fp32 ({which}), 4 bytes a "
            "parameter with an fp32 residual stream under autocast; planner plans it in the compute dtype, so its "
            "memory is a lower bound: set dtype bfloat16 in the recipe")


def _bf16_weights_trained(job: JobFiles, r: Reading) -> str:
    """Why a recipe trains bf16 weights ('' when it does not): its model loads in bfloat16, it trains
    the whole model, and no engine keeps fp32 masters. DeepSpeed's bf16 keeps fp32 partitions and
    accelerate upcasts FSDP's trainable parameters to fp32 under mixed precision, but plain torch
    and DDP step the bf16 parameters themselves, their AdamW moments bf16 too (torch AdamW's
    states follow the parameter's dtype): bf16-pure, whatever ``bf16`` says (autocast over bf16
    weights). An adapter's base loads in bf16 either way (peft keeps the adapters fp32). axolotl
    replaces accelerate's FSDP2 preparation with one that does not upcast: bf16-pure there too
    (planner/check/frameworks.py)."""
    d = job.training_args
    key = next((k for k in LOAD_DTYPE_KEYS if k in d), None)
    if key is None or d[key] not in ("bfloat16", "bf16") or not _no_master_engine(job):
        return ""
    return f"{key} {d[key]} (bf16 weights and states: no engine keeps fp32 masters)"


def _read_load_dtype(job: JobFiles, r: Reading) -> None:
    """runtime.json's load dtype: bfloat16 weights make a not-mixed job bf16-pure (and contradict a
    mixed one); fp32 weights make it fp32."""
    where = f"{job.runtime_where}: dtype"
    dtype = job.runtime.get("dtype", "float32")
    if job.runtime.get("lora") is not None:  # a frozen base loads in the compute dtype: the flags decide
        if dtype not in ("bfloat16", "float16", "float32"):
            r.problems.append(f"{where}: {dtype!r} is not a planned load dtype for an adapter's frozen base")
        elif dtype == "bfloat16" and r.values.get("precision", (None,))[0] in (NOT_MIXED, None):
            r.set("precision", Precision.BF16_PURE, where, REFINES)
        elif dtype == "float32" and r.values.get("precision", (None,))[0] in (NOT_MIXED, None):
            r.set("precision", Precision.FP32, where, REFINES)
        return
    if dtype == "bfloat16":
        r.set("precision", Precision.BF16_PURE, where, REFINES)
    elif dtype == "float32":
        if r.values.get("precision", (None,))[0] in (NOT_MIXED, None):
            r.set("precision", Precision.FP32, where, REFINES)
    else:
        r.problems.append(f"{where}: {dtype!r} is not a planned load dtype (float32, or bfloat16 for bf16-pure)")


def _settle(value: str, planned: str | None) -> tuple[str, str]:
    """A "not mixed" reading: bf16-pure when plan.json says the weights are bf16, else fp32."""
    if value != NOT_MIXED:
        return value, ""
    if planned == Precision.BF16_PURE:
        return Precision.BF16_PURE, " (plan.json: bf16 weights)"
    return Precision.FP32, " (fp32 weights)"


def _twin(combo) -> Precision | None:
    """fp16-mixed's twin is bf16-mixed: the same states, memory and speed (SIXTEEN_BIT_MIXED), one
    ranking family, and simpler (no loss scaling). A GPU without bf16 refuses the twin, so there
    fp16-mixed is searched as itself."""
    return Precision.BF16_MIXED if combo["precision"] == Precision.FP16_MIXED else None


STRATEGY = Strategy(
    "precision", Precision, Precision.BF16_MIXED, order=1, short="precision", bare=True,
    help="weights, gradients and compute dtypes: fp32, fp16-mixed, bf16-mixed, bf16-pure (no fp32 master), "
         "fp8-mixed (fp8 matmuls)",
    check=_check, apply=_apply, time=_time, emit=_emit, read=_read, storage=_storage, settle=_settle,
    runtime="planner.runtime.precision", records=CHOICES, twin=_twin,
)
