"""Offload: optimizer state (and parameters) in host RAM, updated by a CPU optimizer.

- optimizer: DeepSpeed ZeRO-Offload (zero1-3 ``offload_optimizer: cpu``). The fp32 master
  partition, optimizer states and fp32 gradient partition live in pinned host memory; the GPU
  keeps 16-bit weights and the reduce buckets. Host: 16 bytes per parameter / N per rank.
  Source: Ren et al. 2021, "ZeRO-Offload"; DeepSpeed estimate_zero2_model_states_mem_needs.
- optimizer+params: FSDP2 CPUOffloadPolicy (sharded fp32 parameters, gradients and states on the
  host, the optimizer step on the CPU). Under ZeRO-3 it is DeepSpeed's ``offload_param: cpu`` as
  well (the 16-bit partition on the host too, 18 bytes per parameter / N), which is refused
  (``PARAM_OFFLOAD_REFUSAL``: measured runs held 1.7-2.5x what the ledger counts).
- params: ZeRO-3 ``offload_param: cpu`` alone (``offload_param`` without ``offload_optimizer``,
  DeepSpeed ``runtime/zero/stage3.py``); FSDP2 has no parameter-only offload. Read from job files
  and refused, for the same reason.
The ledger and time rows of DeepSpeed's parameter offload stay written (a refused plan still
shows what planner would count), so that the measured gap can be closed row by row.
DeepSpeed's CPU optimizers exist for Adam(W) and Lion; FSDP offload runs any torch optimizer
on the CPU (not bitsandbytes, which needs CUDA tensors).
"""

from dataclasses import dataclass
from enum import StrEnum

from planner.core.emitted import EmitDraft
from planner.core.job import JobFiles, Reading
from planner.core.ledger import LedgerDraft, Location, PagedInfo
from planner.core.specs import HardwareSpec
from planner.core.timing import TimeDraft, Window
from planner.cost import comms, overheads, params
from planner.strategies import rates
from planner.strategies.base import Check, Choice, Engine, PlanContext, Strategy
from planner.strategies.optimizer import DEEPSPEED_CPU
from planner.strategies.sharding import ZERO, Sharding


class Offload(StrEnum):
    NONE = "none"
    OPTIMIZER = "optimizer"
    OPTIMIZER_PARAMS = "optimizer+params"
    PARAMS = "params"



#: Why DeepSpeed ZeRO-3's ``offload_param`` is refused: what it holds on the GPU is not known.
#: Measured on an H100 (benchmarks/results/H100-SXM-80/2026-11-28-run13, Llama-3.2-1B, fp16,
#: ZeRO-3 with optimizer and parameters offloaded, 1 x 1024, accumulation 2): allocated peak
#: 3.50 GiB where the ledger held 2.06, reserved 6.65 GiB, the driver 7.93 against 3.72 planned;
#: forward held 2.05 GB more once DeepSpeed's parameter trace was complete (run 14) than in the
#: first step. Published (benchmarks/world/peaks.yaml, LLaMA-Factory, Llama-3-8B, 8 x RTX 3090,
#: the same settings): 13.0 GiB against 5.3. Neither the gathered parameters DeepSpeed keeps by
#: its reuse distance (partitioned_param_coordinator.py ``__params_to_release``) nor the whole
#: 16-bit model explains both, so the plan is refused, not planned low.
PARAM_OFFLOAD_REFUSAL = (
    "DeepSpeed ZeRO-3 with offloaded parameters (offload_param) is not modelled: real runs held "
    "1.7-2.5x the memory planner counts (an H100 run, a published 8B run), for reasons not yet "
    "known; use offload optimizer+params with fsdp, or offload optimizer with zero3")


def _check(ctx: PlanContext, out: Check) -> None:
    off, s, opt = ctx.config.offload, ctx.config.sharding, ctx.config.optimizer
    if off == Offload.NONE:
        return
    if off == Offload.OPTIMIZER and ctx.engine != Engine.DEEPSPEED:
        hint = "use optimizer+params with fsdp" if ctx.engine == Engine.FSDP else "use zero1, zero2 or zero3"
        out.reject("optimizer offload without ZeRO",
                   f"offload optimizer is DeepSpeed ZeRO-Offload and needs a ZeRO stage; {hint}")
    if off == Offload.PARAMS or (off == Offload.OPTIMIZER_PARAMS and s == Sharding.ZERO3):
        out.reject("deepspeed parameter offload", PARAM_OFFLOAD_REFUSAL)
    elif off == Offload.OPTIMIZER_PARAMS and ctx.engine != Engine.FSDP:
        out.reject("parameter offload without fsdp",
                   "offload optimizer+params needs sharded parameters: use fsdp (FSDP2's CPUOffloadPolicy)")
    if ctx.engine == Engine.DEEPSPEED and off != Offload.PARAMS and opt not in DEEPSPEED_CPU:
        out.reject("no DeepSpeed CPU optimizer for it", "offload runs DeepSpeed's CPU optimizer, which exists for "
                   f"{' and '.join(DEEPSPEED_CPU)}, not {opt}")
    # (bitsandbytes optimizers under FSDP are rejected by the optimizer strategy)


@dataclass(frozen=True)
class OffloadChoice(Choice):
    """One offload value: ``on_host``, the model-state terms it keeps in pinned host memory."""

    on_host: frozenset[str]


#: Every offload value. Host RAM, PCIe and the CPU optimizer step become part of the job
#: (complexity); parameter-only offload is read from job files and planned when asked, not searched.
CHOICES: dict[Offload, OffloadChoice] = {
    Offload.NONE: OffloadChoice("every model state on the GPU", frozenset()),
    Offload.OPTIMIZER: OffloadChoice("DeepSpeed ZeRO-Offload: master weights, states and gradients in host RAM",
                                     frozenset({"master_weights", "optimizer_states", "gradients"}), complexity=2),
    Offload.OPTIMIZER_PARAMS: OffloadChoice(
        "the parameters too (ZeRO-3 offload_param, or FSDP2's CPUOffloadPolicy)",
        frozenset({"master_weights", "optimizer_states", "gradients", "weights"}), complexity=3),
    Offload.PARAMS: OffloadChoice("ZeRO-3's 16-bit parameter partition alone (the optimizer steps on the GPU)",
                                  frozenset({"weights"}), complexity=2, searched=False),
}


def _storage(ctx: PlanContext, decided: dict) -> dict:
    """The model-state terms in host memory (their divisor stays the sharding strategy's). DeepSpeed
    copies gradients straight into a persistent fp32 host partition, which replaces the GPU's 16-bit
    gradient partition and the step's fp32 upcast (strategies/sharding.py writes it)."""
    off = ctx.config.offload
    return {"host_terms": CHOICES[off].on_host,
            "gradients_in_host_partition": decided["engine"] == Engine.DEEPSPEED and off not in (Offload.NONE, Offload.PARAMS)}


def _time(ctx: PlanContext, ledger: LedgerDraft, paged: PagedInfo | None, draft: TimeDraft) -> None:
    """Host-link traffic per rank (pinned copies at HOST_LINK_EFFICIENCY of the GPU's host link)
    and the CPU optimizer step, which all ranks of a node share and which nothing hides.
    DeepSpeed: 16-bit gradients down every micro-batch, updated 16-bit parameters up once per
    step; with offloaded parameters also the 16-bit partition up in forward and backward.
    FSDP CPU offload: the host's parameter shard (the ledger's host weight rows: fp32 under the
    mixed precisions, 16-bit under bf16-pure, an adapter plan's frozen base as stored, NF4 codes
    included) up in forward and again in backward, the trained parameters' gradients (the host
    gradient rows) down. The CPU steps what is trained: every parameter, or an adapter's."""
    off, hw = ctx.config.offload, ctx.hardware
    if off == Offload.NONE:
        return
    partition = params.total_parameters(ctx.model) / ctx.layout.shard_degree
    link = hw.gpu.host_link_bytes_per_s

    def host(n_bytes: float) -> float:
        return comms.transfer_seconds(n_bytes, link, overheads.HOST_LINK_EFFICIENCY)

    if off == Offload.PARAMS:  # the partition up for forward and backward, the updated one down
        draft.overlapped("offload", "parameter partition to GPU (forward)", host(2 * partition), Window.FORWARD, True)
        draft.overlapped("offload", "parameter partition to GPU (backward)", host(2 * partition), Window.BACKWARD, True)
        draft.serial("offload", "updated parameter partition to host", host(2 * partition))
        return
    if ctx.engine == Engine.DEEPSPEED:
        draft.overlapped("offload", "gradient partition to host", host(2 * partition), Window.BACKWARD, True)
        draft.serial("offload", "updated parameters to GPU", host(2 * partition))
        if off == Offload.OPTIMIZER_PARAMS:
            draft.overlapped("offload", "parameter partition to GPU (forward)", host(2 * partition), Window.FORWARD, True)
            draft.overlapped("offload", "parameter partition to GPU (backward)", host(2 * partition), Window.BACKWARD, True)
    else:
        on_host = [r for r in ledger.rows if r.location == Location.HOST]
        shard = sum(r.bytes for r in on_host if r.term == "weights")
        grads = max((r.bytes for r in on_host if r.term == "gradients"), default=0)
        draft.overlapped("offload", "parameter shard to GPU (forward)", host(shard), Window.FORWARD, True)
        draft.overlapped("offload", "parameter shard to GPU (backward) + gradients to host",
                         host(shard + grads), Window.BACKWARD, True)
    stepped = ctx.layout.trainable_parameters / ctx.layout.shard_degree
    cpu = stepped * hw.gpus_per_node / rates.cpu_optimizer_rate(hw, ctx.engine)
    draft.serial("cpu_optimizer_step", "optimizer step on the CPU", cpu,
                 note=f"{hw.gpus_per_node} ranks share the node's CPUs")


def _emit(ctx: PlanContext, files: EmitDraft) -> None:
    off = ctx.config.offload
    if off == Offload.NONE:
        return
    if ctx.engine == Engine.DEEPSPEED:
        zero = files.deepspeed_config()["zero_optimization"]
        if off != Offload.PARAMS:
            zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if off in (Offload.OPTIMIZER_PARAMS, Offload.PARAMS):
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
        if off == Offload.PARAMS:
            return
        optimizer = files.deepspeed_config().get("optimizer")
        if optimizer:  # DeepSpeed's CPU Adam / CPU Lion run the offloaded step
            for key in ("torch_adam", "fused"):
                optimizer["params"].pop(key, None)
        files.notes.append(
            "offload: DeepSpeed compiles its CPU optimizer (cpu_adam / cpu_lion) on first use: a C++ compiler "
            "and ninja must be on the machine"
        )
    else:
        files.fsdp()["fsdp_offload_params"] = True
        files.trainer_fsdp()["cpu_offload"] = True


DEVICES = {None: False, "none": False, "cpu": True, "nvme": True}


def _read(job: JobFiles, r: Reading) -> None:
    """DeepSpeed's offload devices (its JSON, or accelerate's inline keys); FSDP parameter offload;
    none where a file says the engine and no offload (DDP and single-process jobs offload nothing)."""
    if job.distributed_type in ("NO", "MULTI_GPU"):
        r.set("offload", Offload.NONE, f"{job.accelerate_where}: distributed_type {job.distributed_type}")
    inline = job.accelerate_inline_deepspeed
    if inline is not None:
        _devices(inline.get("offload_optimizer_device"), inline.get("offload_param_device"),
                 f"{job.accelerate_where}: deepspeed_config", r)
    if job.deepspeed_where:
        where = job.deepspeed_where
        zero = r.section(job.deepspeed, "zero_optimization", where)
        optimizer_device, param_device = (r.section(zero, key, f"{where}: zero_optimization").get("device")
                                          for key in ("offload_optimizer", "offload_param"))
        _devices(optimizer_device, param_device, f"{where}: zero_optimization", r)
    for fsdp in job.fsdp:
        offload = fsdp.get("offload_params", fsdp.config.get("cpu_offload", False)) or "offload" in fsdp.options
        if offload in (True, "true"):
            r.set("offload", Offload.OPTIMIZER_PARAMS, f"{fsdp.file}: FSDP parameter offload")
        else:
            r.set("offload", Offload.NONE, f"{fsdp.file}: FSDP without parameter offload")


def _devices(optimizer_device, param_device, where: str, r: Reading) -> None:
    for dev in (optimizer_device, param_device):
        if not isinstance(dev, (str, type(None))) or dev not in DEVICES:
            r.problems.append(f"{where}: offload device must be none, cpu or nvme, not {dev!r}")
            return
    if "nvme" in (optimizer_device, param_device):
        r.warnings.append(f"{where}: NVMe offload is modelled as CPU offload (host RAM is then overstated)")
    if DEVICES[param_device]:
        r.set("offload", Offload.OPTIMIZER_PARAMS if DEVICES[optimizer_device] else Offload.PARAMS, where)
    elif DEVICES[optimizer_device]:
        r.set("offload", Offload.OPTIMIZER, where)
    else:
        r.set("offload", Offload.NONE, f"{where}: no offload device")


def _savers(c, hardware: HardwareSpec) -> list[tuple[str, dict]]:
    out = []
    if c.offload == Offload.NONE:
        if c.sharding in ZERO:
            out.append(("offload none -> optimizer", {"offload": Offload.OPTIMIZER}))
        if c.sharding in (Sharding.FSDP, Sharding.FSDP_HYBRID, Sharding.FSDP_GRAD_OP):
            out.append(("offload none -> optimizer+params", {"offload": Offload.OPTIMIZER_PARAMS}))
    return out


STRATEGY = Strategy(
    "offload", Offload, Offload.NONE, order=4, short="offload",
    help="model states in host RAM: none, optimizer (DeepSpeed ZeRO-Offload), optimizer+params (FSDP2; "
         "ZeRO-3's offload_param is refused: not modelled), params (ZeRO-3 offload_param alone: refused)",
    check=_check, storage=_storage, time=_time, emit=_emit, read=_read, savers=_savers,
    records=CHOICES,
)
