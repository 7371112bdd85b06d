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

from planner.cost import params as P
from planner.ledger import ALL_PHASES, LedgerDraft, Location
from planner.vocabulary import Offload, Optimizer, Sharding
from strategies.base import Check, Engine, PlanContext, Strategy
from strategies.sharding import shard_degree

DEEPSPEED_CPU_OPTIMIZERS = (Optimizer.ADAMW, Optimizer.LION)


def _check(ctx: PlanContext, out: Check) -> None:
    off, s, opt = ctx.config.offload, ctx.config.sharding, ctx.config.optimizer
    if off == Offload.NONE:
        return
    if off == Offload.OPTIMIZER and ctx.engine != Engine.DEEPSPEED:
        hint = "use optimizer+params with fsdp" if ctx.engine == Engine.FSDP else "use zero1, zero2 or zero3"
        out.infeasible.append(f"offload optimizer is DeepSpeed ZeRO-Offload and needs a ZeRO stage; {hint}")
    if off == Offload.OPTIMIZER_PARAMS and not (s == Sharding.ZERO3 or ctx.engine == Engine.FSDP):
        out.infeasible.append("offload optimizer+params needs sharded parameters: use zero3 or fsdp")
    if ctx.engine == Engine.DEEPSPEED and opt not in DEEPSPEED_CPU_OPTIMIZERS:
        out.infeasible.append(f"offload runs DeepSpeed's CPU optimizer, which exists for adamw and lion, not {opt}")
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


STRATEGY = Strategy("offload", tuple(Offload), _check, _apply)
