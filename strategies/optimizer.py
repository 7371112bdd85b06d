"""Optimizer: state bytes per parameter tensor, paging, and the step's temporaries.

Implementations modelled (what the emitted files will run):
adamw: torch AdamW, fused (no step temporaries); adamw-8bit / paged-adamw / paged-adamw-8bit /
lion / lion-8bit: bitsandbytes (32-bit bitsandbytes states are always fp32; under FSDP1 they step
the flat parameter shards), except adamw-8bit under FSDP2: torchao's AdamW8bit (the same layout: 8-bit states in blocks of 256 with an fp32 scale each,
32-bit states for tensors under 4096 elements; torchao/optim/adam.py ``_new_buffer``), because
bitsandbytes' cannot step sharded DTensor parameters; adam-mini: the
reference Adam-mini; adafactor: transformers Adafactor (beta1=None); sgd: torch SGD with the
Trainer's default momentum 0 (no state).
"""

from enum import StrEnum
from functools import cache

from planner.core.emitted import EmitDraft
from planner.core.job import JobFiles, Reading
from planner.core.ledger import Ledger, LedgerDraft, Location, PagedInfo, Phase
from planner.core.specs import HardwareSpec, ModelSpec
from planner.core.timing import TimeDraft
from planner.cost import adapters as AD
from planner.cost import comms
from planner.cost import optimizer_states as S
from planner.cost import params as P
from planner.cost import runtime as R
from strategies import rates
from planner.core.numerics import Rung
from strategies.base import Check, Engine, PlanContext, Strategy
from strategies.moments import FROZEN


class Optimizer(StrEnum):
    ADAMW = "adamw"
    ADAMW_8BIT = "adamw-8bit"
    PAGED_ADAMW = "paged-adamw"
    PAGED_ADAMW_8BIT = "paged-adamw-8bit"
    ADAM_MINI = "adam-mini"
    ADAFACTOR = "adafactor"
    LION = "lion"
    LION_8BIT = "lion-8bit"
    SGD = "sgd"


BITSANDBYTES_8BIT_OR_PAGED = (
    Optimizer.ADAMW_8BIT, Optimizer.PAGED_ADAMW, Optimizer.PAGED_ADAMW_8BIT, Optimizer.LION_8BIT,
)
PAGED = (Optimizer.PAGED_ADAMW, Optimizer.PAGED_ADAMW_8BIT)
QUANTIZED = (Optimizer.ADAMW_8BIT, Optimizer.PAGED_ADAMW_8BIT, Optimizer.LION_8BIT)
#: The optimizers searched unless --optimizer names others: Adam and the implementations that
#: approximate it (8-bit and paged states, Adam-mini's shared second moments). Lion, Adafactor
#: and SGD are different learning algorithms whose hyperparameters do not carry over from
#: AdamW, so the planner never swaps them in on its own.
SEARCHED = (Optimizer.ADAMW, Optimizer.ADAMW_8BIT, Optimizer.PAGED_ADAMW, Optimizer.PAGED_ADAMW_8BIT, Optimizer.ADAM_MINI)


def tensor_state_bytes(opt: Optimizer, t: P.ParamTensor, state_bytes: int) -> int:
    """Optimizer state bytes for one parameter tensor (all its experts)."""
    match opt:
        case Optimizer.ADAMW:
            return S.full_states(t.numel, 2, state_bytes)
        case Optimizer.PAGED_ADAMW:
            return S.full_states(t.numel, 2, 4)
        case Optimizer.ADAMW_8BIT | Optimizer.PAGED_ADAMW_8BIT:
            return S.blockwise_8bit_states(t.numel // t.experts, 2) * t.experts
        case Optimizer.ADAM_MINI:
            return S.adam_mini_states(t.shape, state_bytes) * t.experts
        case Optimizer.ADAFACTOR:
            return S.adafactor_states(t.shape) * t.experts
        case Optimizer.LION:
            return S.full_states(t.numel, 1, 4)
        case Optimizer.LION_8BIT:
            return S.blockwise_8bit_states(t.numel // t.experts, 1) * t.experts
        case Optimizer.SGD:
            return 0
    raise ValueError(opt)


def state_bytes_split(ctx: PlanContext) -> tuple[int, int]:
    """(dense bytes, paged bytes) of optimizer state for the whole model, unsharded."""
    return _state_bytes_split(ctx.model, ctx.config.optimizer, ctx.layout.state_bytes, ctx.layout.adapter)


@cache
def _state_bytes_split(m: ModelSpec, opt: Optimizer, sb: int, adapter: AD.AdapterSpec | None) -> tuple[int, int]:
    dense = paged = 0
    for t in AD.trainable_tensors(m, adapter):
        b = tensor_state_bytes(opt, t, sb) * P.multiplicity(m, t)
        if opt in PAGED and t.numel // t.experts >= S.BNB_PAGED_MIN_NUMEL:
            paged += b
        else:
            dense += b
    return dense, paged


def _check(ctx: PlanContext, out: Check) -> None:
    opt = ctx.config.optimizer
    if opt in BITSANDBYTES_8BIT_OR_PAGED and opt != Optimizer.ADAMW_8BIT and ctx.fsdp2:
        out.reject(
            "bitsandbytes optimizer under FSDP2",
            f"{opt}: bitsandbytes 8-bit and paged optimizers do not work under FSDP2 (sharded DTensor parameters); "
            "use --fsdp-version 1 (flat parameters, which they step), zero2/zero3, or adamw / adamw-8bit "
            "(torchao) / adam-mini under FSDP2"
        )
    if opt in QUANTIZED:
        out.warnings.append(f"{opt} quantizes optimizer states to 8 bits block-wise: an approximation of 32-bit states")


def _apply(ctx: PlanContext, ledger: LedgerDraft) -> None:
    opt = ctx.config.optimizer
    dense, paged = state_bytes_split(ctx)
    ledger.add("optimizer_states", f"optimizer states ({opt})", dense, 1, note=_note(opt))
    if paged:
        ledger.add(
            "optimizer_states", f"paged optimizer states ({opt}, unified memory)", paged, 1,
            location=Location.UNIFIED, note="CUDA managed memory: resident while the GPU has room, else host",
        )
    if opt == Optimizer.ADAMW:
        # torch AdamW keeps an fp32 `step` scalar per parameter tensor (torch/optim/adamw.py
        # _init_group; on the device when fused). DeepSpeed hands it flat partitions: one per group.
        # Every rank holds all of them, so sharding does not divide this row.
        count = 1 if ctx.engine == Engine.DEEPSPEED else sum(P.multiplicity(ctx.model, t) for t in _trained(ctx))
        ledger.add("optimizer_states", "optimizer step counters (fp32 scalar per tensor)", count, 4,
                   tag="step_counters", note=f"{count:,} tensors")
    if opt in (Optimizer.ADAFACTOR, Optimizer.ADAM_MINI):
        largest = max(t.numel // t.experts for t in _trained(ctx))
        ledger.add(
            "optimizer_step_temporaries", "per-tensor update temporaries", S.per_tensor_step_temporary(largest), 1,
            phases=frozenset({Phase.STEP}), note="two fp32 tensors the size of the largest parameter",
        )


def _trained(ctx: PlanContext) -> tuple[P.ParamTensor, ...]:
    return AD.trainable_tensors(ctx.model, ctx.layout.adapter)


def _note(opt: Optimizer) -> str:
    return {
        Optimizer.ADAMW: "exp_avg + exp_avg_sq",
        Optimizer.PAGED_ADAMW: "2 fp32 states",
        Optimizer.ADAMW_8BIT: "2 x (1 B + fp32 absmax / 256), fp32 under 4096 elements",
        Optimizer.PAGED_ADAMW_8BIT: "2 x (1 B + fp32 absmax / 256), fp32 under 4096 elements",
        Optimizer.ADAM_MINI: "full m, one v per block",
        Optimizer.ADAFACTOR: "factored second moment (row + column)",
        Optimizer.LION: "momentum (fp32)",
        Optimizer.LION_8BIT: "momentum 1 B + fp32 absmax / 256",
        Optimizer.SGD: "no state (momentum 0)",
    }[opt]


def _time(ctx: PlanContext, ledger: Ledger, paged: PagedInfo | None, draft: TimeDraft) -> None:
    """The GPU optimizer step is memory bound: it reads gradients, reads and writes states and
    the fp32 weights (or master copy, plus the 16-bit copy it refreshes) and any fp32 gradient
    upcast: bytes from this rank's GPU ledger rows / achieved bandwidth (roofline). Paged state
    that spilled migrates in and back out over the host link once per step."""
    gpu_rows = [r for r in ledger.rows if r.location == Location.GPU and Phase.STEP in r.phases
                and r.tag not in FROZEN]  # (an adapter's frozen base is not updated)

    def total(*terms: str) -> int:
        return sum(r.bytes for r in gpu_rows if r.term in terms)

    states, master, weights, grads = total("optimizer_states"), total("master_weights"), total("weights"), total("gradients")
    upcast = sum(r.bytes for r in gpu_rows if "fp32 gradient partition" in r.label)
    refreshed = 2 * master + weights if master else 2 * weights
    traffic = 2 * states + grads + refreshed + 2 * upcast
    if states or grads:
        draft.serial("optimizer_step", f"{ctx.config.optimizer} step on the GPU", traffic / rates.bandwidth(ctx),
                     note=f"{traffic / 2**30:.1f} GiB moved")
    if paged and paged.spilled_bytes:
        link = ctx.hardware.gpu.host_link_bytes_per_s
        seconds = comms.transfer_seconds(2 * paged.spilled_bytes, link, R.HOST_LINK_EFFICIENCY)
        draft.serial("paged_migration", "paged state in and out of host RAM", seconds,
                     note=f"{paged.spilled_bytes / 2**30:.1f} GiB spilled")


#: transformers TrainingArguments.optim names (transformers.training_args.OptimizerNames).
#: Adam-mini has none: runtime.json names it and the runtime builds it.
TRAINER_OPTIM = {
    Optimizer.ADAMW: "adamw_torch_fused",
    Optimizer.ADAMW_8BIT: "adamw_bnb_8bit",
    Optimizer.PAGED_ADAMW: "paged_adamw_32bit",
    Optimizer.PAGED_ADAMW_8BIT: "paged_adamw_8bit",
    Optimizer.ADAFACTOR: "adafactor",
    Optimizer.LION: "lion_32bit",
    Optimizer.LION_8BIT: "lion_8bit",
    Optimizer.SGD: "sgd",
}
#: Optimizers DeepSpeed builds itself from its JSON (torch AdamW: DeepSpeed's fused Adam would
#: need a CUDA toolchain at run time). Others are passed to DeepSpeed as client optimizers.
DEEPSPEED_NATIVE = {Optimizer.ADAMW: "AdamW", Optimizer.LION: "Lion"}


def _emit(ctx: PlanContext, files: EmitDraft) -> None:
    """The Trainer's ``optim`` (torchao's 8-bit AdamW under FSDP2, where bitsandbytes' cannot run on
    sharded DTensor parameters); Adam-mini, which has no optim name, in runtime.json (the runtime
    builds it and hands it to the Trainer, which then ignores ``optim``); DeepSpeed's own optimizer
    block where DeepSpeed runs the step."""
    opt = ctx.config.optimizer
    if opt == Optimizer.ADAMW_8BIT and ctx.fsdp2:
        files.training_args["optim"] = TORCHAO_ADAMW_8BIT
        files.extras.add("torchao")
    elif opt in TRAINER_OPTIM:
        files.training_args["optim"] = TRAINER_OPTIM[opt]
        files.extras |= {"bitsandbytes"} if opt in BITSANDBYTES else set()
    else:
        files.runtime["optimizer"] = str(opt)
        files.extras.add(str(opt))  # adam-mini
    if files.deepspeed is not None and opt in DEEPSPEED_NATIVE:
        # lr and weight_decay: "auto" (the Trainer and accelerate's DummyOptim fill them); betas and
        # eps: the Trainer's defaults written out, because accelerate fills only lr / weight_decay
        params = {"lr": "auto", "weight_decay": "auto", "betas": [0.9, 0.999]}
        if opt == Optimizer.ADAMW:
            params |= {"eps": 1e-8, "torch_adam": True}
        files.deepspeed["optimizer"] = {"type": DEEPSPEED_NATIVE[opt], "params": params}


#: The optimizers the runtime builds (runtime.json ``optimizer``): those with no Trainer optim name.
RUNTIME_BUILT = tuple(o for o in Optimizer if o not in TRAINER_OPTIM)
#: The Trainer's torchao 8-bit AdamW (the adamw-8bit of FSDP2 plans).
TORCHAO_ADAMW_8BIT = "adamw_torch_8bit"
#: The Trainer optim names that build a bitsandbytes optimizer (32-bit Lion included).
BITSANDBYTES = (*BITSANDBYTES_8BIT_OR_PAGED, Optimizer.LION)


#: Trainer ``optim`` names -> vocabulary (transformers OptimizerNames; aliases included).
TRAINER_READS = {
    "adamw_torch": Optimizer.ADAMW, "adamw_torch_fused": Optimizer.ADAMW, "adamw_hf": Optimizer.ADAMW,
    "adamw_apex_fused": Optimizer.ADAMW, "adamw_8bit": Optimizer.ADAMW_8BIT, "adamw_bnb_8bit": Optimizer.ADAMW_8BIT,
    "paged_adamw_32bit": Optimizer.PAGED_ADAMW, "paged_adamw_8bit": Optimizer.PAGED_ADAMW_8BIT,
    "adafactor": Optimizer.ADAFACTOR, "lion_32bit": Optimizer.LION, "lion_8bit": Optimizer.LION_8BIT, "sgd": Optimizer.SGD,
    TORCHAO_ADAMW_8BIT: Optimizer.ADAMW_8BIT,
}
#: DeepSpeed optimizer ``type`` names (case-insensitive) -> vocabulary.
DEEPSPEED_READS = {"adamw": Optimizer.ADAMW, "adam": Optimizer.ADAMW, "lion": Optimizer.LION}


def _read(job: JobFiles, r: Reading) -> None:
    """The Trainer's ``optim``, DeepSpeed's ``optimizer.type``; unknown ones are counted as AdamW.
    runtime.json's optimizer is the one that runs (the Trainer ignores ``optim`` when handed one)."""
    built = job.runtime.get("optimizer") if job.runtime_where else None
    if built is not None:
        if built in RUNTIME_BUILT:
            r.set("optimizer", Optimizer(built), f"{job.runtime_where}: optimizer {built}")
        else:
            r.problems.append(f"{job.runtime_where}: optimizer {built!r}: the runtime builds only "
                              f"{', '.join(RUNTIME_BUILT)} (name others in the Trainer's optim)")
        return
    if job.training_args_where:
        where = job.training_args_where
        optim = r.typed(job.training_args, "optim", (str,), where)
        if optim is not None:
            if optim in TRAINER_READS:
                r.set("optimizer", TRAINER_READS[optim], f"{where}: optim {optim}")
            else:
                r.warnings.append(f"{where}: optim {optim} is not modelled; its states are counted as AdamW's")
    if job.deepspeed_where:
        where = job.deepspeed_where
        opt = r.section(job.deepspeed, "optimizer", where)
        if isinstance(opt.get("type"), str):
            name = DEEPSPEED_READS.get(opt["type"].lower())
            if name:
                r.set("optimizer", name, f"{where}: optimizer.type {opt['type']}")
            else:
                r.warnings.append(f"{where}: DeepSpeed optimizer {opt['type']} is not modelled; states counted as AdamW's")


EIGHT_BIT = {Optimizer.ADAMW: Optimizer.ADAMW_8BIT, Optimizer.PAGED_ADAMW: Optimizer.PAGED_ADAMW_8BIT,
             Optimizer.LION: Optimizer.LION_8BIT}
PAGED_FORM = {Optimizer.ADAMW: Optimizer.PAGED_ADAMW, Optimizer.ADAMW_8BIT: Optimizer.PAGED_ADAMW_8BIT}


def _savers(c, hardware: HardwareSpec) -> list[tuple[str, dict]]:
    """8-bit states, then paged states (the same algorithm's implementations)."""
    out = []
    for table, what in ((EIGHT_BIT, "8-bit states"), (PAGED_FORM, "paged states")):
        if c.optimizer in table:
            out.append((f"optimizer {c.optimizer} -> {table[c.optimizer]} ({what})", {"optimizer": table[c.optimizer]}))
    return out


STRATEGY = Strategy(
    "optimizer", Optimizer, Optimizer.ADAMW, order=0, short="optimizer", bare=True, searched=SEARCHED,
    help="the optimizer and its state precision and paging",
    check=_check, apply=_apply, time=_time, emit=_emit, read=_read, savers=_savers,
    runtime="planner.runtime.optimizer", runtime_only=RUNTIME_BUILT,
    numerics={Optimizer.ADAMW_8BIT: Rung.STATES_8BIT, Optimizer.PAGED_ADAMW_8BIT: Rung.STATES_8BIT,
              Optimizer.ADAM_MINI: Rung.ADAM_MINI, Optimizer.ADAFACTOR: Rung.METHOD, Optimizer.LION: Rung.METHOD,
              Optimizer.LION_8BIT: Rung.METHOD, Optimizer.SGD: Rung.METHOD},
    # paging moves state through unified memory; a library beyond torch for the others
    complexity={o: 2 if o == Optimizer.PAGED_ADAMW_8BIT else 1 for o in Optimizer if o != Optimizer.ADAMW},
)
