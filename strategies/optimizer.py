"""Optimizer: state bytes per parameter tensor, paging, and the step's temporaries.

Each value is one ``OptimizerChoice`` record (``CHOICES``): its state rule (a formula of
planner/cost/optimizer_states.py), its rung on the numerics ladder, the implementation that runs
it on each engine (the Trainer ``optim`` name, the class the runtime builds and the live check
recognises), the names ``planner check`` reads it from, and the engines that refuse it. Every
layer reads these records: this strategy's hooks, planner/runtime/optimizer.py,
planner/launch/live.py and session.py, and the probes.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache

from planner.core import job as job_module
from planner.core.emitted import EmitDraft
from planner.core.job import JobFiles, Reading
from planner.core.ledger import LedgerDraft, Location, PagedInfo, Phase
from planner.core.numerics import Rung
from planner.core.specs import HardwareSpec, ModelSpec
from planner.core.timing import TimeDraft
from planner.cost import adapters, comms, optimizer_states, overheads, params
from planner.strategies import rates
from planner.strategies.base import Check, Choice, Engine, PlanContext, Strategy
from planner.strategies.moments import FROZEN


class Optimizer(StrEnum):
    ADAMW = "adamw"
    ADAMW_FOREACH = "adamw-foreach"
    ADAMW_8BIT = "adamw-8bit"
    ADAMW_4BIT = "adamw-4bit"
    PAGED_ADAMW = "paged-adamw"
    PAGED_ADAMW_8BIT = "paged-adamw-8bit"
    ADAM_MINI = "adam-mini"
    ADAFACTOR = "adafactor"
    LION = "lion"
    LION_8BIT = "lion-8bit"
    SGD = "sgd"


#: The rungs of the numerics ladder the optimizers sit on (planner/core/numerics.py).
STATES_8BIT = Rung("8-bit-states", 1.0, "8-bit optimizer states", source=(
    "block-wise quantised, fp32 absmax per 256 elements: Dettmers et al. 2022, \"8-bit Optimizers via "
    "Block-wise Quantization\" (ICLR), report 32-bit accuracy recovered across LM pre-training and "
    "fine-tuning benchmarks"))
STATES_4BIT = Rung("4-bit-states", 1.5, "4-bit optimizer states", source=(
    "Li et al. 2023, \"Memory Efficient Optimizers with 4-bit States\" (NeurIPS), match 32-bit AdamW on "
    "fine-tuning and pre-training benchmarks with finer blocks and zero-point-free second moments; "
    "torchao's block-wise AdamW4bit follows it; fewer bits than 8-bit states: more rounding risk"))
ADAM_MINI_MOMENTS = Rung("adam-mini", 3.0, "Adam-mini's shared second moments", source=(
    "one second-moment value per block instead of per parameter: Zhang et al. 2024, \"Adam-mini: Use "
    "Fewer Learning Rates To Gain More\" show parity with AdamW on their runs; a different update rule, "
    "so results can differ from AdamW's"))
METHOD = Rung("method", 5.0, "a different optimizer", named_only=True, source=(
    "Lion, Adafactor, SGD: a different learning algorithm whose hyperparameters do not carry over "
    "from AdamW; used only when the user names it"))


@dataclass(frozen=True)
class Impl:
    """One implementation of an optimizer value: the class that runs it and how it is built.

    ``library`` is the pip extra (and package) it needs ("" for torch and transformers);
    ``trainer_optim`` the Trainer ``optim`` name that builds it (None: the runtime builds it from
    runtime.json); ``fake``: it runs under fake tensors (the traced probe traces its states, else
    they are computed from ``OptimizerChoice.states``). ``bits`` / ``paged``: for bitsandbytes,
    whose one class serves 8 and 32 bits, paged or not (the Trainer passes ``optim_bits`` and
    ``is_paged``), the live object's attributes that tell the values apart. ``call``: how the
    runtime calls the class (planner/runtime/optimizer.py ``CALLS``): ``params`` (the trainable
    parameters and the learning rate), ``fused`` (torch's fused kernel on CUDA), ``adafactor``
    (the Trainer's fixed learning rate: no relative step, no parameter scaling), ``named`` (named
    parameters and the model's head counts: Adam-mini)."""

    module: str
    cls: str
    trainer_optim: str | None
    library: str = ""
    fake: bool = False
    bits: int | None = None
    paged: bool | None = None
    call: str = "params"

    @property
    def family(self) -> str:
        """bitsandbytes' algorithm, which its class names share ("AdamW", "Lion")."""
        return "Lion" if "Lion" in self.cls else "AdamW"


@dataclass(frozen=True)
class OptimizerChoice(Choice):
    """Everything every layer needs of one optimizer value (DESIGN.md "Strategies"): a ``Choice``
    (help, rung, complexity, searched, runtime_only: Adam-mini, which no Trainer name builds) and

    ``states(numel, shape, state_bytes)``: state bytes of one parameter tensor of ``numel``
    elements (one expert's), with ``state_bytes`` the layout's full-precision state element
    (planner/cost/optimizer_states.py holds the formulas). ``impl`` builds it; ``fsdp2`` builds it
    under FSDP2 where that differs; ``refused_on``: the engines it cannot run on, each with why.
    ``reads``: other Trainer ``optim`` names read as this value; ``deepspeed``: DeepSpeed's own
    optimizer ``type`` (DeepSpeed builds it from its JSON), ``deepspeed_reads`` other type names;
    ``deepspeed_cpu``: DeepSpeed has a CPU optimizer for it (ZeRO-Offload); ``live``: other
    (module, class) pairs the live check reads as this value."""

    states: Callable[[int, tuple[int, ...], int], int]
    note: str
    impl: Impl
    complexity: int = field(default=1, kw_only=True)  # a library beyond torch
    searched: bool = field(default=False, kw_only=True)
    paged: bool = False
    state_bits: int = 32  # the bits of a quantized state element (32: not quantized)
    step_temporaries: bool = False
    foreach: bool = False  # torch's multi-tensor kernels: a tensor list the size of one state at the step
    fsdp2: Impl | None = None
    refused_on: tuple[tuple[str, str], ...] = ()  # (engine, why): engines are ``engine_of``'s names
    reads: tuple[str, ...] = ()
    deepspeed: str = ""
    deepspeed_reads: tuple[str, ...] = ()
    deepspeed_cpu: bool = False
    live: tuple[tuple[str, str], ...] = ()
    lighter: tuple[tuple[str, str], ...] = ()  # (value, what): the same algorithm, holding less

    @property
    def quantized(self) -> bool:
        return self.state_bits < 16

    def refusal(self, engine: str) -> str:
        """Why it cannot run on ``engine`` ("" when it can)."""
        return next((why for on, why in self.refused_on if on == engine), "")

    def impl_for(self, fsdp2: bool) -> Impl:
        return self.fsdp2 if fsdp2 and self.fsdp2 is not None else self.impl


BNB = "bitsandbytes.optim"
BNB_FSDP2 = ("bitsandbytes 8-bit and paged optimizers do not work under FSDP2 (sharded DTensor parameters); "
             "use --fsdp-version 1 (flat parameters, which they step), zero2/zero3, or adamw / adamw-8bit "
             "(torchao) / adam-mini under FSDP2")


def _blockwise(n_states: int):
    return lambda numel, shape, sb: optimizer_states.blockwise_8bit_states(numel, n_states)


#: Every optimizer value, in vocabulary order. Implementations (what the emitted files run): torch
#: AdamW, fused; bitsandbytes for the 8-bit, paged and Lion values (32-bit bitsandbytes states are
#: always fp32; under FSDP1 they step the flat parameter shards), except adamw-8bit under FSDP2:
#: torchao's AdamW8bit (the same layout: 8-bit states in blocks of 256 with an fp32 scale each,
#: 32-bit states for tensors under 4096 elements; torchao/optim/adam.py ``_new_buffer``), because
#: bitsandbytes' cannot step sharded DTensor parameters; the reference Adam-mini; transformers
#: Adafactor (beta1=None); torch SGD with the Trainer's default momentum 0 (no state).
CHOICES: dict[Optimizer, OptimizerChoice] = {
    Optimizer.ADAMW: OptimizerChoice(
        "torch AdamW (fused): fp32 master, two states per parameter",
        lambda numel, shape, sb: optimizer_states.full_states(numel, 2, sb), "exp_avg + exp_avg_sq",
        Impl("torch.optim", "AdamW", "adamw_torch_fused", fake=True, call="fused"), complexity=0, searched=True,
        reads=("adamw_hf", "adamw_apex_fused"), deepspeed="AdamW", deepspeed_reads=("adam",),
        deepspeed_cpu=True, live=(("deepspeed", "DeepSpeedCPUAdam"), ("deepspeed", "FusedAdam")),
        lighter=(("adamw-8bit", "8-bit states"), ("paged-adamw", "paged states"))),
    Optimizer.ADAMW_FOREACH: OptimizerChoice(
        "torch AdamW (foreach, the Trainer's adamw_torch): as adamw, plus a sqrt(exp_avg_sq) copy at the step",
        lambda numel, shape, sb: optimizer_states.full_states(numel, 2, sb), "exp_avg + exp_avg_sq",
        # not traced (fake=False): under fake tensors the foreach step allocates 1.64x the sqrt list
        # on Qwen2.5-0.5B, where the real allocator holds exactly one (tests/test_optimizer_step.py)
        Impl("torch.optim", "AdamW", "adamw_torch"), complexity=0, foreach=True, deepspeed="AdamW",
        live=(("torch.optim", "Adam"),), lighter=(("adamw", "the fused kernel: no step copy"),)),
    Optimizer.ADAMW_8BIT: OptimizerChoice(
        "AdamW with 8-bit block-wise states (bitsandbytes; torchao under FSDP2)", _blockwise(2),
        "2 x (1 B + fp32 absmax / 256), fp32 under 4096 elements",
        Impl(BNB, "AdamW8bit", "adamw_bnb_8bit", "bitsandbytes", bits=8, paged=False),
        rung=STATES_8BIT, searched=True, state_bits=8,
        fsdp2=Impl("torchao.optim", "AdamW8bit", "adamw_torch_8bit", "torchao"), reads=("adamw_8bit",),
        lighter=(("paged-adamw-8bit", "paged states"), ("adamw-4bit", "4-bit states"))),
    Optimizer.ADAMW_4BIT: OptimizerChoice(
        "AdamW with 4-bit block-wise states (torchao)",
        lambda numel, shape, sb: optimizer_states.torchao_4bit_states(numel, 2, sb),
        "2 x (4 bits + fp32 scale / 256), full under 4096 elements",
        Impl("torchao.optim", "AdamW4bit", "adamw_torch_4bit", "torchao"),
        rung=STATES_4BIT, searched=True, state_bits=4,
        refused_on=(("deepspeed", "torchao's low-bit optimizers step the plain or FSDP2 parameters they are "
                                  "given, not DeepSpeed's flat partitions (not modelled); use adamw-8bit with ZeRO"),
                    ("fsdp1", "torchao's low-bit optimizers run under FSDP2 (DTensor shards), not FSDP1's flat "
                              "parameters (not modelled); use --fsdp-version 2"))),
    Optimizer.PAGED_ADAMW: OptimizerChoice(
        "AdamW with 32-bit states in CUDA unified memory (bitsandbytes)",
        lambda numel, shape, sb: optimizer_states.full_states(numel, 2, 4), "2 fp32 states",
        Impl(BNB, "PagedAdamW32bit", "paged_adamw_32bit", "bitsandbytes", bits=32, paged=True),
        searched=True, paged=True, refused_on=(("fsdp2", BNB_FSDP2),), lighter=(("paged-adamw-8bit", "8-bit states"),)),
    Optimizer.PAGED_ADAMW_8BIT: OptimizerChoice(
        "AdamW with 8-bit states in CUDA unified memory (bitsandbytes)", _blockwise(2),
        "2 x (1 B + fp32 absmax / 256), fp32 under 4096 elements",
        Impl(BNB, "PagedAdamW8bit", "paged_adamw_8bit", "bitsandbytes", bits=8, paged=True),
        rung=STATES_8BIT, complexity=2, searched=True, paged=True, state_bits=8, refused_on=(("fsdp2", BNB_FSDP2),)),
    Optimizer.ADAM_MINI: OptimizerChoice(
        "Adam-mini: one second moment per block", lambda numel, shape, sb: optimizer_states.adam_mini_states(shape, sb),
        "full m, one v per block", Impl("adam_mini", "Adam_mini", None, "adam-mini", call="named"),
        rung=ADAM_MINI_MOMENTS, searched=True, step_temporaries=True, runtime_only=True),
    Optimizer.ADAFACTOR: OptimizerChoice(
        "Adafactor (transformers, beta1=None): factored second moment",
        lambda numel, shape, sb: optimizer_states.adafactor_states(shape, sb), "factored second moment (row + column)",
        Impl("transformers.optimization", "Adafactor", "adafactor", fake=True, call="adafactor"), rung=METHOD,
        step_temporaries=True),
    Optimizer.LION: OptimizerChoice(
        "Lion (bitsandbytes, 32-bit momentum)", lambda numel, shape, sb: optimizer_states.full_states(numel, 1, 4),
        "momentum (fp32)", Impl(BNB, "Lion32bit", "lion_32bit", "bitsandbytes", bits=32, paged=False),
        rung=METHOD, refused_on=(("fsdp2", BNB_FSDP2),), deepspeed="Lion", deepspeed_cpu=True,
        live=(("deepspeed", "DeepSpeedCPULion"), ("deepspeed", "FusedLion")), lighter=(("lion-8bit", "8-bit states"),)),
    Optimizer.LION_8BIT: OptimizerChoice(
        "Lion with 8-bit momentum (bitsandbytes)", _blockwise(1), "momentum 1 B + fp32 absmax / 256",
        Impl(BNB, "Lion8bit", "lion_8bit", "bitsandbytes", bits=8, paged=False),
        rung=METHOD, state_bits=8, refused_on=(("fsdp2", BNB_FSDP2),)),
    Optimizer.SGD: OptimizerChoice(
        "torch SGD, momentum 0 (the Trainer's default): no state", lambda numel, shape, sb: 0,
        "no state (momentum 0)", Impl("torch.optim", "SGD", "sgd", fake=True), rung=METHOD),
}

PAGED = tuple(o for o, c in CHOICES.items() if c.paged)
QUANTIZED = tuple(o for o, c in CHOICES.items() if c.quantized)
#: The optimizers searched unless --optimizer names others: Adam and the implementations that
#: approximate it (8-bit and paged states, Adam-mini's shared second moments). Lion, Adafactor
#: and SGD are different learning algorithms whose hyperparameters do not carry over from
#: AdamW, so the planner never swaps them in on its own.
SEARCHED = tuple(o for o, c in CHOICES.items() if c.searched)
#: The optimizers the runtime builds (runtime.json ``optimizer``): those no Trainer optim name builds.
RUNTIME_BUILT = tuple(o for o, c in CHOICES.items() if c.runtime_only)
#: Optimizers DeepSpeed runs as ZeRO-Offload's CPU optimizer.
DEEPSPEED_CPU = tuple(o for o, c in CHOICES.items() if c.deepspeed_cpu)


def tensor_state_bytes(opt: Optimizer, t: params.ParamTensor, state_bytes: int) -> int:
    """Optimizer state bytes for one parameter tensor (all its experts)."""
    per_expert = t.numel // t.experts
    return CHOICES[opt].states(per_expert, t.shape, state_bytes) * t.experts


def state_bytes_split(ctx: PlanContext) -> tuple[int, int]:
    """(dense bytes, paged bytes) of optimizer state for the whole model, unsharded."""
    return _state_bytes_split(ctx.model, ctx.config.optimizer, ctx.layout.state_bytes, ctx.layout.adapter)


@cache
def _state_bytes_split(m: ModelSpec, opt: Optimizer, sb: int, adapter: adapters.AdapterSpec | None) -> tuple[int, int]:
    dense = paged = 0
    for t in adapters.trainable_tensors(m, adapter):
        b = tensor_state_bytes(opt, t, sb) * params.multiplicity(m, t)
        if opt in PAGED and t.numel // t.experts >= optimizer_states.BNB_PAGED_MIN_NUMEL:
            paged += b
        else:
            dense += b
    return dense, paged


def engine_of(ctx: PlanContext) -> str:
    """The engine an optimizer steps under, as ``OptimizerChoice.refused_on`` names it: torch,
    deepspeed, fsdp1 or fsdp2."""
    if ctx.engine == Engine.FSDP:
        return "fsdp2" if ctx.fsdp2 else "fsdp1"
    return str(ctx.engine)


def _check(ctx: PlanContext, out: Check) -> None:
    choice = CHOICES[ctx.config.optimizer]
    engine = engine_of(ctx)
    if choice.refusal(engine):
        out.reject(f"{choice.impl.library or ctx.config.optimizer} optimizer under {engine.upper()}",
                   f"{ctx.config.optimizer}: {choice.refusal(engine)}")
    if choice.quantized:
        out.warnings.append(f"{ctx.config.optimizer} quantizes optimizer states to {choice.state_bits} bits "
                            "block-wise: an approximation of 32-bit states")


def _apply(ctx: PlanContext, ledger: LedgerDraft) -> None:
    opt = ctx.config.optimizer
    choice = CHOICES[opt]
    dense, paged = state_bytes_split(ctx)
    place = ctx.layout.placement("optimizer_states")
    ledger.add("optimizer_states", f"optimizer states ({opt})", dense, 1, place=place, note=choice.note)
    if paged:
        ledger.add(
            "optimizer_states", f"paged optimizer states ({opt}, unified memory)", paged, 1, place=place,
            location=Location.UNIFIED, note="CUDA managed memory: resident while the GPU has room, else host",
        )
    if opt == Optimizer.ADAMW:
        # torch AdamW keeps an fp32 `step` scalar per parameter tensor (torch/optim/adam.py
        # _init_group): on the device when fused, on the host otherwise (foreach: not counted).
        # Every rank holds all of them: sharding does not divide this row.
        count = stepped_tensors(ctx)
        ledger.add("optimizer_states", "optimizer step counters (fp32 scalar per tensor)", count, 4,
                   place=place.replicated, note=f"{count:,} tensors")
    if choice.foreach and place.location == Location.GPU:  # (host tensors step one at a time: no foreach on CPU)
        ledger.add("optimizer_step_temporaries", "foreach sqrt(exp_avg_sq), every tensor at once",
                   optimizer_states.foreach_step_temporary(dense), 1, place=place, phases=frozenset({Phase.STEP}),
                   note="torch's multi-tensor AdamW; the fused kernel holds none")
    if choice.step_temporaries:
        largest = max(t.numel // t.experts for t in _trained(ctx))
        ledger.add(
            "optimizer_step_temporaries", "per-tensor update temporaries", optimizer_states.per_tensor_step_temporary(largest), 1,
            phases=frozenset({Phase.STEP}), note="two fp32 tensors the size of the largest parameter",
        )


def _trained(ctx: PlanContext) -> tuple[params.ParamTensor, ...]:
    return adapters.trainable_tensors(ctx.model, ctx.layout.adapter)


def stepped_tensors(ctx: PlanContext) -> int:
    """The tensors the optimizer steps: the trained ones (``_trained``: every parameter tensor,
    tied embeddings once; an adapter's A and B, and DoRA's magnitude, per wrapped module); under
    DeepSpeed, the flat fp32 partitions the engine hands it, one a parameter group (the Trainer's
    two: with and without weight decay)."""
    if ctx.engine == Engine.DEEPSPEED:
        return TRAINER_PARAM_GROUPS
    return sum(params.multiplicity(ctx.model, t) for t in _trained(ctx))


def per_tensor_step_seconds(ctx: PlanContext) -> tuple[float, str]:
    """(host seconds, library) of an optimizer that steps one parameter tensor at a time
    (``overheads.PER_TENSOR_STEP_SECONDS``; 0 for torch's foreach and fused kernels): the
    ``stepped_tensors`` times its cost a tensor."""
    library = CHOICES[ctx.config.optimizer].impl_for(ctx.fsdp2).library
    cost = overheads.PER_TENSOR_STEP_SECONDS.get(library, 0.0)
    return (stepped_tensors(ctx) * cost if cost else 0.0), library


#: The Trainer's optimizer parameter groups: with weight decay, and without (biases and norms).
TRAINER_PARAM_GROUPS = 2


def _time(ctx: PlanContext, ledger: LedgerDraft, paged: PagedInfo | None, draft: TimeDraft) -> None:
    """The GPU optimizer step is memory bound: it reads gradients, reads and writes states and
    the fp32 weights (or master copy, plus the 16-bit copy it refreshes) and any fp32 gradient
    upcast: bytes from this rank's GPU ledger rows / achieved bandwidth (roofline). Paged state
    that spilled migrates in and back out over the host link once per step.

    The fused kernel passes over each tensor once. torch's foreach AdamW (``_multi_tensor_adam``)
    runs seven kernels over the states: lerp_ (m, g), mul_ (v), addcmul_ (v, g), sqrt (v into a
    copy t), div_ (t), add_ (t), addcdiv_ (p, m, t): 14 state-sized reads and writes where the
    fused kernel has 4, and the gradients read twice (decoupled weight decay, off by default in
    the Trainer, would add one more pass over the parameters; not counted).

    Gradient clipping (``max_grad_norm`` 1.0: the Trainer's default, TRL's, DeepSpeed's
    ``gradient_clipping: auto`` and what planner writes) reads the stepped gradients for their
    norm and scales them in place (torch.nn.utils ``clip_grad_norm_``: ``_foreach_norm`` then
    ``_foreach_mul_``; DeepSpeed's unscale_and_clip_grads likewise): three passes over them."""
    gpu_rows = [r for r in ledger.rows if r.location == Location.GPU and Phase.STEP in r.phases
                and r.tag not in FROZEN]  # (an adapter's frozen base is not updated)

    def total(*terms: str) -> int:
        return sum(r.bytes for r in gpu_rows if r.term in terms)

    states, master, weights, grads = total("optimizer_states"), total("master_weights"), total("weights"), total("gradients")
    upcast = sum(r.bytes for r in gpu_rows if "fp32 gradient partition" in r.label)
    refreshed = 2 * master + weights if master else 2 * weights
    state_passes, grad_passes = (7, 2) if CHOICES[ctx.config.optimizer].foreach else (2, 1)
    traffic = state_passes * states + grad_passes * grads + refreshed + 2 * upcast
    if states or grads:
        kernels = traffic / rates.bandwidth(ctx)
        host, library = per_tensor_step_seconds(ctx)
        seconds = kernels + host if library in overheads.SYNCHRONIZED_STEP else max(kernels, host)
        draft.serial("optimizer_step", f"{ctx.config.optimizer} step on the GPU", seconds,
                     note=f"{traffic / 2**30:.1f} GiB moved"
                     + (f"; {library} steps tensor by tensor, {host * 1e3:.0f} ms on the host" if host else ""))
        clipped = 3 * (upcast or grads)
        draft.serial("optimizer_step", "gradient clipping (norm, then scale)", clipped / rates.bandwidth(ctx),
                     note=f"{clipped / 2**30:.1f} GiB moved")
    if paged and paged.spilled_bytes:
        seconds = comms.transfer_seconds(2 * paged.spilled_bytes, rates.page_migration_rate(ctx.hardware), 1.0)
        draft.serial("paged_migration", "paged state in and out of host RAM", seconds,
                     note=f"{paged.spilled_bytes / 2**30:.1f} GiB spilled")


def _emit(ctx: PlanContext, files: EmitDraft) -> None:
    """The Trainer's ``optim`` of the value's implementation on this engine; one with no optim name
    (Adam-mini) in runtime.json (the runtime builds it and hands it to the Trainer, which then
    ignores ``optim``); DeepSpeed's own optimizer block where DeepSpeed runs the step."""
    opt = ctx.config.optimizer
    choice = CHOICES[opt]
    impl = choice.impl_for(ctx.fsdp2)
    if impl.trainer_optim is not None:
        files.training_args["optim"] = impl.trainer_optim
    else:
        files.runtime["optimizer"] = str(opt)
    if impl.library:
        files.extras.add(impl.library)
    if files.deepspeed is not None and choice.deepspeed:
        # lr and weight_decay: "auto" (the Trainer and accelerate's DummyOptim fill them); betas and
        # eps: the Trainer's defaults written out, because accelerate fills only lr / weight_decay
        hyper: dict[str, object] = {"lr": "auto", "weight_decay": "auto", "betas": [0.9, 0.999]}
        if opt in (Optimizer.ADAMW, Optimizer.ADAMW_FOREACH):
            # torch's AdamW (no DeepSpeed op to build): ``torch_adam`` passes the other params to
            # torch.optim.AdamW (deepspeed/runtime/engine.py get_optimizer_configuration), foreach
            # unless ``fused`` says otherwise
            hyper |= {"eps": 1e-8, "torch_adam": True} | ({"fused": True} if opt == Optimizer.ADAMW else {})
        files.deepspeed["optimizer"] = {"type": choice.deepspeed, "params": hyper}


def trainer_names() -> dict[str, Optimizer]:
    """Trainer ``optim`` names -> vocabulary (transformers OptimizerNames; aliases included)."""
    out: dict[str, Optimizer] = {}
    for opt, c in CHOICES.items():
        impls = (c.impl, c.fsdp2) if c.fsdp2 is not None else (c.impl,)
        for name in (*(i.trainer_optim for i in impls), *c.reads):
            if name:
                out[name] = opt
    return out


TRAINER_READS = trainer_names()
#: DeepSpeed optimizer ``type`` names (lower case) -> vocabulary.
#: torch's AdamW (``torch_adam``) reads as adamw-foreach unless ``fused`` is set (``deepspeed_optimizer``).
DEEPSPEED_READS = {name.lower(): o for o, c in CHOICES.items() if not c.foreach
                   for name in (c.deepspeed, *c.deepspeed_reads) if name}


def deepspeed_optimizer(block: dict) -> Optimizer | None:
    """The vocabulary value of a DeepSpeed ``optimizer`` block (None: not modelled). Adam / AdamW
    run DeepSpeed's FusedAdam, or its CPU Adam under offload; with ``torch_adam`` true, torch's
    AdamW with the block's other params: foreach unless ``fused`` is true (``foreach`` false, the
    single-tensor loop, is read as adamw: its temporaries over DeepSpeed's flat partitions are not
    modelled)."""
    name = DEEPSPEED_READS.get(str(block.get("type", "")).lower())
    params = block.get("params")
    if (name == Optimizer.ADAMW and isinstance(params, dict) and params.get("torch_adam") is True
            and params.get("fused") is not True and params.get("foreach") is not False):
        return Optimizer.ADAMW_FOREACH
    return name


#: The first transformers whose TrainingArguments default ``optim`` is adamw_torch_fused where torch
#: is at least 2.8 (training_args.py ``default_optim``; adamw_torch before, and with older torch).
FUSED_DEFAULT_SINCE, FUSED_DEFAULT_TORCH = (4, 54), (2, 8)


def _trainer_default_optim() -> tuple[str, str] | None:
    """The Trainer's default ``optim`` with the transformers and torch installed here, and why;
    None where transformers is not installed (the vocabulary's default, adamw, stands)."""
    tf, torch = job_module.installed_release("transformers"), job_module.installed_release("torch")
    if tf is None:
        return None
    fused = tf >= FUSED_DEFAULT_SINCE and torch is not None and torch >= FUSED_DEFAULT_TORCH
    name = "adamw_torch_fused" if fused else "adamw_torch"
    versions = f"transformers {'.'.join(map(str, tf))}" + (f", torch {'.'.join(map(str, torch))}" if torch else "")
    return name, f"the Trainer's default {name} ({versions} installed here)"


def _deepspeed_offloads(job: JobFiles) -> bool:
    """Whether the job's DeepSpeed config offloads the optimizer (to cpu or nvme)."""
    zero = job.deepspeed.get("zero_optimization") if job.deepspeed_where else None
    offload = zero.get("offload_optimizer") if isinstance(zero, dict) else None
    return isinstance(offload, dict) and str(offload.get("device", "none")).lower() not in ("none", "")


def _read(job: JobFiles, r: Reading) -> None:
    """The optimizer that runs: runtime.json's (the Trainer ignores ``optim`` when handed one);
    else DeepSpeed's ``optimizer`` block, which DeepSpeed builds whatever the Trainer's ``optim``
    (one naming another is said, not used); else the Trainer's ``optim``, or its default with the
    transformers and torch installed here; torch's AdamW under DeepSpeed's optimizer offload is
    swapped for DeepSpeed's CPU Adam by accelerate. Unknown names are counted as AdamW."""
    built = job.runtime.get("optimizer") if job.runtime_where else None
    if built is not None:
        if built in RUNTIME_BUILT:
            r.set("optimizer", Optimizer(built), f"{job.runtime_where}: optimizer {built}")
        else:
            r.problems.append(f"{job.runtime_where}: optimizer {built!r}: the runtime builds only "
                              f"{', '.join(RUNTIME_BUILT)} (name others in the Trainer's optim)")
        return
    trainer: tuple[Optimizer, str] | None = None
    if job.training_args_where:
        where = job.training_args_where
        optim = r.typed(job.training_args, "optim", (str,), where)
        if optim is not None and optim not in TRAINER_READS:
            r.warnings.append(f"{where}: optim {optim} is not modelled; its states are counted as AdamW's")
        elif optim is not None:
            trainer = TRAINER_READS[optim], f"{where}: optim {optim}"
        elif (default := _trainer_default_optim()) is not None:
            trainer = TRAINER_READS[default[0]], f"{where}: no optim; {default[1]}"
    block = r.section(job.deepspeed, "optimizer", job.deepspeed_where) if job.deepspeed_where else {}
    if isinstance(block.get("type"), str):
        where, name = job.deepspeed_where, deepspeed_optimizer(block)
        if name is None:
            r.warnings.append(f"{where}: DeepSpeed optimizer {block['type']} is not modelled; states counted as AdamW's")
            return
        torch_adam = ", torch_adam without fused (torch's foreach AdamW)" if name == Optimizer.ADAMW_FOREACH else ""
        r.set("optimizer", name, f"{where}: optimizer.type {block['type']}{torch_adam}")
        if trainer is not None and trainer[0] != name and "no optim" not in trainer[1]:
            r.warnings.append(f"{trainer[1]} is not what runs: DeepSpeed builds its optimizer block ({name})")
        return
    if trainer is None:
        return
    if trainer[0] == Optimizer.ADAMW_FOREACH and _deepspeed_offloads(job):
        trainer = Optimizer.ADAMW, (f"{trainer[1]}, which accelerate swaps for DeepSpeed's CPU Adam under "
                                    "optimizer offload (map_pytorch_optim_to_deepspeed)")
    r.set("optimizer", *trainer)


def _savers(c, hardware: HardwareSpec) -> list[tuple[str, dict]]:
    """The same algorithm holding less (``OptimizerChoice.lighter``: 8-bit states, then paged)."""
    return [(f"optimizer {c.optimizer} -> {to} ({what})", {"optimizer": Optimizer(to)})
            for to, what in CHOICES[c.optimizer].lighter]


STRATEGY = Strategy(
    "optimizer", Optimizer, Optimizer.ADAMW, order=0, short="optimizer", bare=True,
    help="the optimizer and its state precision and paging",
    check=_check, apply=_apply, time=_time, emit=_emit, read=_read, savers=_savers,
    runtime="planner.runtime.optimizer", records=CHOICES,
)
