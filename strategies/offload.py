"""Offload: optimizer state (and parameters) in host RAM, updated by a CPU optimizer.

- optimizer: DeepSpeed ZeRO-Offload (zero1-3 ``offload_optimizer: cpu``). The fp32 master
  partition, optimizer states and fp32 gradient partition live in pinned host memory; the GPU
  keeps 16-bit weights and the reduce buckets. Host: 16 bytes per parameter / N per rank.
  Source: Ren et al. 2021, "ZeRO-Offload"; DeepSpeed estimate_zero2_model_states_mem_needs.
- optimizer+params: ZeRO-3 ``offload_param: cpu`` as well (16-bit partition on the host too, 18
  bytes per parameter / N), or FSDP2 CPUOffloadPolicy (sharded fp32 parameters, gradients and
  states on the host, the optimizer step on the CPU).
DeepSpeed's CPU optimizers exist for Adam(W) and Lion; FSDP offload runs any torch optimizer
on the CPU (not bitsandbytes, which needs CUDA tensors).
"""

from planner.cost import comms
from planner.cost import params as P
from planner.cost import runtime as R
from planner.core.emitted import EmitDraft
from planner.core.ledger import ALL_PHASES, Ledger, LedgerDraft, Location, PagedInfo
from planner.core.timing import TimeDraft, Window
from planner.core.vocabulary import Offload, Optimizer, Sharding
from strategies.base import Check, Engine, PlanContext, Strategy
from strategies.sharding import shard_degree

DEEPSPEED_CPU_OPTIMIZERS = (Optimizer.ADAMW, Optimizer.LION)


def _check(ctx: PlanContext, out: Check) -> None:
    off, s, opt = ctx.config.offload, ctx.config.sharding, ctx.config.optimizer
    if off == Offload.NONE:
        return
    if off == Offload.OPTIMIZER and ctx.engine != Engine.DEEPSPEED:
        hint = "use optimizer+params with fsdp" if ctx.engine == Engine.FSDP else "use zero1, zero2 or zero3"
        out.reject("optimizer offload without ZeRO", f"offload optimizer is DeepSpeed ZeRO-Offload and needs a ZeRO stage; {hint}")
    if off == Offload.OPTIMIZER_PARAMS and not (s == Sharding.ZERO3 or ctx.engine == Engine.FSDP):
        out.reject("parameter offload without zero3 or fsdp", "offload optimizer+params needs sharded parameters: use zero3 or fsdp")
    if ctx.engine == Engine.DEEPSPEED and opt not in DEEPSPEED_CPU_OPTIMIZERS:
        out.reject("no DeepSpeed CPU optimizer for it", f"offload runs DeepSpeed's CPU optimizer, which exists for adamw and lion, not {opt}")
    # (bitsandbytes optimizers under FSDP are rejected by the optimizer strategy)


def _apply(ctx: PlanContext, ledger: LedgerDraft) -> None:
    off = ctx.config.offload
    if off == Offload.NONE:
        return
    moved = ledger.of("master_weights", "optimizer_states", "gradients")
    if off == Offload.OPTIMIZER_PARAMS:
        moved += ledger.of("weights")
    if ctx.engine == Engine.DEEPSPEED:
        # DeepSpeed copies gradients straight into a persistent fp32 host partition, which
        # replaces the GPU's 16-bit gradient partition and the step's fp32 upcast.
        ledger.remove(ledger.of("gradients"))
        moved = [r for r in moved if r.term != "gradients"] + ledger.tagged("fp32_grad_partition")
        partition = -(-P.total_parameters(ctx.model) // shard_degree(ctx))
        for row in ledger.tagged("fp32_grad_partition"):  # whole partition, not one sub-group's upcast
            row.phases, row.label, row.elements = ALL_PHASES, "fp32 gradient partition", partition
    for row in moved:
        row.location = Location.HOST


def _time(ctx: PlanContext, ledger: Ledger, paged: PagedInfo | None, draft: TimeDraft) -> None:
    """Host-link traffic per rank (pinned copies at HOST_LINK_EFFICIENCY of the GPU's host link)
    and the CPU optimizer step, which all ranks of a node share and which nothing hides.
    DeepSpeed: 16-bit gradients down every micro-batch, updated 16-bit parameters up once per
    step; with offloaded parameters also the 16-bit partition up in forward and backward.
    FSDP2 CPU offload: fp32 sharded parameters up in forward and backward, gradients down."""
    off, hw = ctx.config.offload, ctx.hardware
    if off == Offload.NONE:
        return
    partition = P.total_parameters(ctx.model) / shard_degree(ctx)
    link = hw.gpu.host_link_bytes_per_s

    def host(n_bytes: float) -> float:
        return comms.transfer_seconds(n_bytes, link, R.HOST_LINK_EFFICIENCY)

    if ctx.engine == Engine.DEEPSPEED:
        draft.overlapped("offload", "gradient partition to host", host(2 * partition), Window.BACKWARD, True)
        draft.serial("offload", "updated parameters to GPU", host(2 * partition))
        if off == Offload.OPTIMIZER_PARAMS:
            draft.overlapped("offload", "parameter partition to GPU (forward)", host(2 * partition), Window.FORWARD, True)
            draft.overlapped("offload", "parameter partition to GPU (backward)", host(2 * partition), Window.BACKWARD, True)
    else:
        draft.overlapped("offload", "fp32 parameter shard to GPU (forward)", host(4 * partition), Window.FORWARD, True)
        draft.overlapped("offload", "fp32 parameter shard to GPU (backward) + gradients to host",
                         host(8 * partition), Window.BACKWARD, True)
    cpu = partition * hw.gpus_per_node / R.CPU_OPTIMIZER_PARAMS_PER_SECOND_PER_NODE
    draft.serial("cpu_optimizer_step", "optimizer step on the CPU", cpu,
                 note=f"{hw.gpus_per_node} ranks share the node's CPUs")


def _emit(ctx: PlanContext, files: EmitDraft) -> None:
    off = ctx.config.offload
    if off == Offload.NONE:
        return
    if ctx.engine == Engine.DEEPSPEED:
        zero = files.deepspeed["zero_optimization"]
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if off == Offload.OPTIMIZER_PARAMS:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
        optimizer = files.deepspeed.get("optimizer")
        if optimizer:  # DeepSpeed's CPU Adam / CPU Lion run the offloaded step
            optimizer["params"].pop("torch_adam", None)
        files.notes.append(
            "offload: DeepSpeed compiles its CPU optimizer (cpu_adam / cpu_lion) on first use: a C++ compiler "
            "and ninja must be on the machine"
        )
    else:
        files.fsdp()["fsdp_offload_params"] = True
        files.trainer_fsdp()["cpu_offload"] = True


STRATEGY = Strategy("offload", tuple(Offload), _check, _apply, _time, _emit)
