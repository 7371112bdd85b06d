"""Tensor parallelism: none, or transformers' own (``from_pretrained(distributed_config=
DistributedConfig(tp_size=T, fsdp_size=D[, dp_replicate_size=R]))``: each decoder layer's
projections, the embeddings and the head split over ``--tp-size`` GPUs of a node at load time,
FSDP2 over the rest).

Each rank of a tensor-parallel group runs every token of its group's micro-batch through its share
of the model: ``planner/cost/tensor.py`` ``rank_model`` (the heads, the MLP's width and the
vocabulary's rows ``1/T``; the hidden width, the norms and the logits whole), which the plan's
context holds in place of the model (strategies/base.py ``PlanContext``), so every memory and FLOP
row is the rank's. The groups are the data-parallel replicas: a step trains ``micro-batch x
accumulation x GPUs / T`` samples, and FSDP2 shards each rank's share over the ``GPUs / T`` ranks
holding the same share (``dp_shard``; hybrid: a node's, replicated across nodes).
- Time: the rank's FLOPs, and the group's all-reduces of the residual stream, on the critical path
  (transformers runs them in the DTensor redistributions of each module's forward and backward;
  no overlap): a layer's two forward (the row-wise projections' outputs) and five backward (each
  column-wise module's input gradient: q, k, v, gate, up; four with a plain MLP), the embeddings'
  forward all-reduce, the head's all-gather of the logits and its input gradient's all-reduce
  (``planner/cost/tensor.py``, counted with CommDebugMode).
- transformers applies FSDP2 itself (``base_model_fsdp_plan``: the embeddings and each layer a unit
  resharded after forward, the final norm and the head one unit kept; ``fsdp_mixed_precision``: bf16
  parameters, fp32 reductions), so accelerate neither wraps nor shards the model again (the Trainer's
  ``is_distributed_loading_by_transformers``) and the Trainer cannot save its optimizer state
  (``save_only_model``). Its units are costed as accelerate's FSDP2 units (strategies/fsdp_memory.py:
  the root holds the embeddings, the final norm and the head), an upper reading of transformers'
  plan, whose embeddings are a unit of their own resharded after forward (not traced yet).
The launch (planner/runtime/tensor_parallel.py) loads the model so; a script of one's own must too
(``check`` says so). Sources: transformers 5.24 ``distributed/configuration_utils.py``
(DistributedConfig), ``distributed/mixin.py`` (``init_parallel_plans``, ``maybe_distribute_model``),
``distributed/tensor_parallel.py`` (the styles), ``distributed/fsdp.py`` (the FSDP2 plan and
policy), ``trainer.py`` (the ParallelismConfig it builds from the model; no accelerate wrapping);
docs/source/en/tensor_parallelism.md ("Tensor parallelism for training").
"""

from enum import StrEnum

from planner.core.emitted import EmitDraft
from planner.core.job import JobFiles, Reading
from planner.core.ledger import LedgerDraft, PagedInfo
from planner.core.timing import TimeDraft, Window
from planner.core.vocabulary import Setting
from planner.cost import comms, tensor
from planner.strategies import rates
from planner.strategies.base import Check, Choice, PlanContext, Strategy


class TensorParallel(StrEnum):
    NONE = "none"
    TRANSFORMERS = "transformers"


CHOICES: dict[TensorParallel, Choice] = {
    TensorParallel.NONE: Choice("every rank holds whole layers"),
    # (not in a space's searched values: a degree changes the data-parallel replicas, which one
    # space holds fixed; suggest searches a space per degree)
    TensorParallel.TRANSFORMERS: Choice("transformers' tensor parallelism: each layer split over --tp-size GPUs, "
                                        "FSDP2 over the rest", complexity=2, searched=False, runtime_only=True),
}

SETTINGS = (
    Setting("tp_size", int, 2, "the tensor-parallel degree (transformers DistributedConfig tp_size): the GPUs of a "
            "node each layer is split over, a divisor of the GPUs per node and of the attention heads", ge=2,
            used_at=("transformers",)),
)

#: What the tensor-parallel plans run with, each field's values (the rest refused with the reason):
#: what transformers' load-time sharding and the Trainer's path for it are known to compose with.
#: Selective checkpointing (the runtime's policy around each DTensor layer) traced at full depth
#: (Llama-3.2-1B TP 2 and 4, Qwen2.5-0.5B and Qwen3-0.6B TP 2 of FSDP2's 8: step peak -0.01 % ..
#: -0.00 %, backward phase -2.2 % .. -0.3 %) and launched live (tests/test_launch_live.py fsdp-tp2).
ALLOWED = {
    "sharding": ("fsdp", "fsdp-hybrid"),
    "fsdp_version": (2,),
    "precision": ("bf16-mixed", "bf16-pure"),
    "offload": ("none",),
    "adapter": ("none",),
    "optimizer": ("adamw",),
    "checkpointing": ("none", "full", "selective"),
    "loss": ("standard",),
    "method": ("sft",),
    "sequence_parallel": ("none",),
    "tiled_mlp": ("none",),
    "checkpoint_offload": ("none",),
}


def _check(ctx: PlanContext, out: Check) -> None:
    cfg = ctx.config
    if cfg.tensor_parallel == TensorParallel.NONE:
        return
    t, hw = cfg.tp_size, ctx.hardware
    if why := tensor.tp_refusal(ctx.whole_model, t):
        out.reject("tp of this model", why, unmodelled=True)
    if hw.gpus_per_node % t:
        out.reject("tp size does not divide a node", f"--tp-size {t} does not divide the {hw.gpus_per_node} GPUs of "
                   "a node: each layer's all-reduces stay within a node")
    elif t >= ctx.world_size:
        out.reject("tp over every gpu", f"--tp-size {t} leaves FSDP no GPUs to shard over ({ctx.world_size} in all): "
                   "a smaller --tp-size")
    # The Trainer defers a load-time sharded model's reduction to the step's last micro-batch with
    # set_requires_gradient_sync(False), or under hybrid sharding only the all-reduce across replicas
    # (set_requires_all_reduce: each micro-batch's reduce-scatter keeps the gradients sharded), which
    # planner's deferred reduction (unsharded gradients held) does not model. (Rules read no accumulation.)
    if cfg.sharding == "fsdp-hybrid" and cfg.gradient_sync == "step":
        out.reject("tp with hybrid deferred sync", "--gradient-sync step under fsdp-hybrid with tensor parallelism "
                   "(the Trainer defers only the all-reduce across nodes) is not modelled: --gradient-sync micro-batch",
                   unmodelled=True)
    for field, allowed in ALLOWED.items():
        value = getattr(cfg, field)
        if value not in allowed and str(value) not in allowed:
            out.reject(f"tp with this {field.replace('_', ' ')}", f"--{field.replace('_', '-')} {value} with tensor "
                       "parallelism is not "
                       f"modelled: {' or '.join(str(a) for a in allowed)}", unmodelled=True)


def _time(ctx: PlanContext, ledger: LedgerDraft, paged: PagedInfo | None, draft: TimeDraft) -> None:
    """The group's collectives per micro-batch (module docstring), over the node's GPU link: the
    layers' all-reduces of (tokens, hidden) in the compute dtype, the embeddings' one, the logits'
    all-gather and the head input gradient's all-reduce; under full checkpointing the recomputed
    forward runs its two all-reduces a layer again in backward."""
    t = ctx.config.tensor_shards
    if t == 1:
        return
    m, c = ctx.model, ctx.layout.dtypes.compute
    over, tokens = rates.link(ctx, False), rates.tokens(ctx)
    hidden = tokens * m.hidden_size * c
    forward_calls, backward_calls = tensor.layer_all_reduces(m)
    recompute = forward_calls if ctx.config.checkpointing == "full" else 0
    gather = comms.all_gather_bytes(tokens * m.vocab_size * c, t)

    def seconds(all_reduces: int, gathered: float = 0.0) -> float:
        return rates.collective_seconds(all_reduces * comms.all_reduce_bytes(hidden, t) + gathered, over,
                                        all_reduces + (1 if gathered else 0))

    draft.compute("communication", "tensor-parallel all-reduces and logits gather (forward)",
                  seconds(m.num_layers * forward_calls + 1, gather), Window.FORWARD,
                  note="each layer's row-wise outputs; the embeddings; the head's logits gathered")
    draft.compute("communication", "tensor-parallel all-reduces (backward" + (" and recompute)" if recompute else ")"),
                  seconds(m.num_layers * (backward_calls + recompute) + 1), Window.BACKWARD,
                  note="each column-wise module's input gradient; the head's")


def _emit(ctx: PlanContext, files: EmitDraft) -> None:
    """runtime.json's ``tensor_parallel`` and ``tp_size``: the planner launch loads the model with
    transformers' DistributedConfig (planner/runtime/tensor_parallel.py), which shards it and applies
    FSDP2; accelerate runs it as plain multi-GPU (the sharding strategy's file says so) and the
    Trainer saves the model only."""
    if ctx.config.tensor_shards == 1:
        return
    t = ctx.config.tensor_shards
    files.runtime |= {"tensor_parallel": str(TensorParallel.TRANSFORMERS), "tp_size": t,
                      "load_sharding": str(ctx.config.sharding)}
    files.training_args["save_only_model"] = True
    files.notes.append(f"tensor parallelism over {t} GPUs of a node: the planner launch loads the model with "
                       f"transformers' DistributedConfig(tp_size={t}, fsdp_size={ctx.layout.shard_degree}), which "
                       "shards it and applies FSDP2 itself; a script of your own must load it so (the Trainer then "
                       "builds the parallelism config); the Trainer saves the model only (no optimizer state)")


#: What a job's own script must do for accelerate's tensor parallelism to run (accelerate 1.15
#: ``Accelerator._prepare_tp``: parameters that are no DTensor are logged "we skip the TP
#: preparation" and trained whole; transformers 5.24 ``Trainer`` takes the TP size from the model).
TP_LOADING = ("your script must load the model sharded to it (from_pretrained(tp_plan=\"auto\", "
              "device_mesh=accelerator.torch_device_mesh[\"tp\"]), or distributed_config=DistributedConfig("
              "tp_size=...)); loaded whole, accelerate only logs \"we skip the TP preparation\" and every rank "
              "trains whole layers, which this verdict does not count")


def _read(job: JobFiles, r: Reading) -> None:
    """runtime.json's ``tensor_parallel`` and ``tp_size`` (the planner launch's); accelerate's
    ``parallelism_config_tp_size`` (its ParallelismConfig: transformers' TP plan over the ``tp``
    mesh, FSDP2 by accelerate over ``dp_shard``; what the model's loading decides, which check
    cannot see, is warned: ``TP_LOADING``); no tensor parallelism where a job's files say how it
    runs and none says it."""
    accelerate_tp = _accelerate_tp(job, r)
    if job.runtime_where and "tensor_parallel" in job.runtime:
        value = job.runtime.get("tensor_parallel")
        if value not in set(TensorParallel):
            r.problems.append(f"{job.runtime_where}: tensor_parallel {value!r}: one of {', '.join(TensorParallel)}"[:300])
            return
        r.set("tensor_parallel", TensorParallel(value), f"{job.runtime_where}: tensor_parallel {value}")
        if value != TensorParallel.NONE:
            size = r.typed(job.runtime, "tp_size", (int,), job.runtime_where)
            if size is not None:
                r.set("tp_size", size, f"{job.runtime_where}: tp_size")
        return
    said = job.runtime_where or job.training_args_where or job.accelerate_where or job.deepspeed_where
    if said and not accelerate_tp:
        r.set("tensor_parallel", TensorParallel.NONE, f"{said}: no tensor parallelism")


def _accelerate_tp(job: JobFiles, r: Reading) -> bool:
    """accelerate's ``parallelism_config_tp_size`` above 1, read as transformers' TP of that degree
    (its sizes are checked against the GPUs by planner/check/job_files.py)."""
    block = job.accelerate.get("parallelism_config") if job.accelerate_where else None
    size = block.get("parallelism_config_tp_size") if isinstance(block, dict) else None
    if not isinstance(size, int) or isinstance(size, bool) or size < 2:
        return False
    where = f"{job.accelerate_where}: parallelism_config.parallelism_config_tp_size"
    r.set("tensor_parallel", TensorParallel.TRANSFORMERS, f"{where} {size} (transformers' TP plan, accelerate's "
                                                         "FSDP2 over the rest)")
    r.set("tp_size", size, where)
    r.warnings.append(f"{where} {size}: {TP_LOADING}")
    return True


def describe(get) -> str:
    """'' without tensor parallelism (it goes without saying), else "transformers x4"."""
    value = get("tensor_parallel")
    return "" if value in (None, TensorParallel.NONE) else f"{value} x{get('tp_size')}"


def _parallelism(ctx: PlanContext) -> dict:
    return {"tensor_parallel": ctx.tensor_shards}


STRATEGY = Strategy(
    "tensor_parallel", TensorParallel, TensorParallel.NONE, order=13, short="tp",
    help="tensor parallelism: none, or transformers (each layer split over --tp-size GPUs of a node at load time, "
         "FSDP2 over the rest; the planner launch loads the model so)",
    check=_check, time=_time, emit=_emit, read=_read, settings=SETTINGS, describe=describe, records=CHOICES,
    parallelism=_parallelism, runtime="planner.runtime.tensor_parallel",
)
