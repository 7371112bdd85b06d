"""Sequence parallelism: none, or Ulysses (DeepSpeed's ALST through accelerate's
``parallelism_config``, ``sp_backend: deepspeed``) over ``--sp-size`` ranks.

Under Ulysses each rank of a group of ``sp_size`` holds ``seq_len / sp_size`` positions of every
sequence: the configuration's token counts are a rank's share (planner/core/vocabulary.py
``sequence_shards``), which every activation, loss and time row reads; attention's FLOPs per token
stay those of the whole sequence (each rank attends over every position for ``heads / sp_size``
heads). Four all-to-alls a layer each way regroup q, k, v and the output (planner/cost/sequence.py);
their copies are a transient of the attention's forward and backward (strategies/checkpointing.py
reads ``exchange_bytes``). ZeRO partitions the model states over every rank, the sequence-parallel
ones included (DeepSpeed's ``seq_data_parallel_group``), so the model-state rows are those of the
same ZeRO stage without it; a step trains ``micro-batch x accumulation x GPUs / sp_size`` samples
(the group's ranks share each sample). DeepSpeed's ``train_batch_size`` counts every rank's
micro-batches instead (transformers fills "auto" so; the replicas' count dies at its ZeRO-3 init).

Sources: accelerate 1.15 ``parallelism_config.py`` (``sp_backend`` deepspeed only; CP and SP
exclusive), ``accelerator.py`` ``_prepare_deepspeed`` (``UlyssesSPAttentionHF.register_with_
transformers``, ``UlyssesSPDataLoaderAdapter``, ``train_batch_size`` over the data-parallel size),
``utils/dataclasses.py`` ``DeepSpeedSequenceParallelConfig`` (eager and flex attention refused),
docs/source/concept_guides/sequence_parallelism.md (the YAML keys; "tested to work with DeepSpeed
ZeRO stage 2 and 3"); DeepSpeed 0.19 ``runtime/sequence_parallel/ulysses_sp.py``; transformers 5.24
``integrations/deepspeed.py`` ``deepspeed_sp_compute_loss`` (each rank's loss over its own
positions, averaged over the group by their valid tokens).
"""

from enum import StrEnum

from planner.core.emitted import EmitDraft
from planner.core.job import JobFiles, Reading
from planner.core.ledger import LedgerDraft, PagedInfo
from planner.core.lengths import Batching
from planner.core.timing import TimeDraft, Window
from planner.core.vocabulary import Setting
from planner.cost import comms, sequence
from planner.strategies import rates
from planner.strategies.base import Check, Choice, Engine, PlanContext, Strategy


class SequenceParallel(StrEnum):
    NONE = "none"
    ULYSSES = "ulysses"


CHOICES: dict[SequenceParallel, Choice] = {
    SequenceParallel.NONE: Choice("every rank holds whole sequences"),
    # (not in a space's searched values: a degree changes the data-parallel replicas, which one
    # space holds fixed; suggest searches a space per degree: planner/engine/degrees.py)
    SequenceParallel.ULYSSES: Choice("DeepSpeed Ulysses (ALST): each sequence split over --sp-size ranks, heads "
                                     "split for attention", complexity=2, searched=False),
}

SETTINGS = (
    Setting("sp_size", int, 2, "Ulysses' degree (accelerate parallelism_config_sp_size): the ranks one sequence is "
            "split over, a divisor of the GPUs and of the attention heads", ge=2, used_at=("ulysses",)),
)

#: The training methods whose trainer's loss under Ulysses is modelled: SFT (transformers'
#: ``deepspeed_sp_compute_loss``); TRL's preference and RL trainers are not yet.
SP_METHODS = ("sft",)


def degrees(m, hardware, seq_len: int) -> list[int]:
    """The degrees Ulysses can split a ``seq_len``-token sequence of ``m`` over on ``hardware``,
    ascending: 2 up to the GPUs of one node (across nodes every layer's all-to-alls would cross the
    network), each dividing the GPUs and the sequence and passing the heads' ``ulysses_refusal``
    (``_check``'s rules)."""
    n = hardware.num_gpus
    return [p for p in range(2, min(hardware.gpus_per_node, n) + 1)
            if n % p == 0 and seq_len % p == 0 and not sequence.ulysses_refusal(m, p)]


def _unmodelled(m, method, batching) -> list[tuple[str, str]]:
    """The rules no degree or technique changes, as (code, reason): the methods whose loss under
    Ulysses is modelled, no sliding window (a 4D mask), packed rows."""
    out = []
    if str(method) not in SP_METHODS:
        out.append(("ulysses with this method", f"--method {method} under Ulysses (its trainer's loss over "
                    "sequence shards) is not modelled yet; plan sft"))
    if m.sliding_window is not None:
        out.append(("ulysses with a sliding window", f"{m.family}'s sliding-window attention needs a 4D mask, which "
                    "Ulysses does not pass: not modelled"))
    if batching != Batching.PACKED:
        out.append(("ulysses with padded batches", "padded batches under Ulysses are padded to a multiple of "
                    "--sp-size by the collator, which planner's launch does not do yet: plan packed batches"))
    return out


def sequence_searchable(m, methods, batching) -> bool:
    """Whether plans of ``m`` under the training ``methods`` and ``batching`` can take Ulysses at
    all (``_unmodelled`` refuses none of them)."""
    return not any(_unmodelled(m, x, batching) for x in methods)


def _check(ctx: PlanContext, out: Check) -> None:
    cfg, m = ctx.config, ctx.model
    if cfg.sequence_parallel != SequenceParallel.ULYSSES:
        return
    p, n = cfg.sp_size, ctx.world_size
    if ctx.engine != Engine.DEEPSPEED:
        out.reject("ulysses without zero", "Ulysses sequence parallelism runs through DeepSpeed (accelerate's only "
                   "sp_backend): use --sharding zero1, zero2 or zero3")
    if n % p:
        out.reject("sp size does not divide the gpus", f"--sp-size {p} does not divide the {n} GPU(s)")
    if why := sequence.ulysses_refusal(m, p):
        out.reject("sp size and heads", f"{m.family}: {why} (UlyssesSPAttentionHF)")
    if cfg.seq_len % p:
        out.reject("seq len not a multiple of sp size",
                   f"--seq-len {cfg.seq_len:,} is not a multiple of --sp-size {p}: each rank takes an equal share")
    if cfg.attention != "sdpa":
        out.reject("ulysses with eager attention", "Ulysses passes position ids, not a 4D mask: accelerate refuses "
                   "eager attention (DeepSpeedSequenceParallelConfig); use --attention sdpa")
    for code, reason in _unmodelled(m, cfg.method, cfg.batching):
        out.reject(code, reason, unmodelled=True)
    if p > ctx.hardware.gpus_per_node:
        out.warnings.append(f"--sp-size {p} spans nodes: every layer's all-to-alls cross the network")


def exchange_bytes(ctx: PlanContext) -> float:
    """Bytes per local token one layer's attention holds for Ulysses' all-to-alls beyond its
    tensors without them (planner/cost/sequence.py ``exchange_transient_elements``, in the compute
    dtype); 0 without sequence parallelism."""
    p = ctx.config.sequence_shards
    if p == 1:
        return 0.0
    return sequence.exchange_transient_elements(ctx.model, p) * ctx.layout.dtypes.compute


def exchange_seconds(ctx: PlanContext) -> float:
    """One pass's all-to-alls over every layer (forward: q, k, v in and the output back; backward
    the same of their gradients), each rank sending all but its ``1/p`` of each, over the link the
    group spans (consecutive ranks: one node where ``p`` fits in it), not overlapped with compute
    (the attention waits for its inputs). Unit: seconds per micro-batch."""
    p = ctx.config.sequence_shards
    if p == 1:
        return 0.0
    m = ctx.model
    elements = sum(sequence.exchanged_elements(m, p))
    message = elements * ctx.layout.dtypes.compute * rates.tokens(ctx)
    over = rates.link(ctx, p > ctx.hardware.gpus_per_node)
    return m.num_layers * rates.collective_seconds(comms.all_to_all_bytes(message, p), over, 4)


def _time(ctx: PlanContext, ledger: LedgerDraft, paged: PagedInfo | None, draft: TimeDraft) -> None:
    seconds = exchange_seconds(ctx)
    if not seconds:
        return
    recompute = ctx.config.checkpointing == "full"
    draft.compute("communication", "Ulysses all-to-alls (forward)", seconds, Window.FORWARD,
                  note="q, k, v and the output of every layer; the attention waits for them")
    draft.compute("communication", "Ulysses all-to-alls (backward" + (" and recompute)" if recompute else ")"),
                  seconds * (2 if recompute else 1), Window.BACKWARD)


def _emit(ctx: PlanContext, files: EmitDraft) -> None:
    """accelerate's ``parallelism_config`` block (its documented DeepSpeed form: the replicas as
    dp_shard_size, sp over the rest), which ``accelerate launch`` turns into the environment its
    Accelerator reads; the Trainer then wraps the data loader and computes the loss over the shards.
    DeepSpeed's ``train_batch_size`` is left to the Trainer (below)."""
    cfg = ctx.config
    p = cfg.sequence_shards
    if p == 1:
        return
    files.accelerate["parallelism_config"] = {
        "parallelism_config_dp_replicate_size": 1,
        "parallelism_config_dp_shard_size": ctx.world_size // p,
        "parallelism_config_sp_size": p,
        "parallelism_config_sp_backend": "deepspeed",
        "parallelism_config_sp_seq_length_is_variable": True,
        "parallelism_config_sp_attn_implementation": str(cfg.attention),
    }
    # "auto": the Trainer fills it with every rank's micro-batches, the count transformers' ZeRO-3
    # init checks the file against (before the sequence-parallel groups exist); the replicas'
    # count dies there (tests/test_launch_live.py zero3-ulysses hit it)
    files.deepspeed_config()["train_batch_size"] = "auto"
    files.notes.append(f"Ulysses sequence parallelism over {p} GPUs: accelerate's launcher reads the parallelism_config "
                       "block, the Trainer shards each batch, and planner's launch gives every row its position ids; "
                       "run live on the CPU only so far (micro-batches of one row), so watch the first steps' memory")


def _read(job: JobFiles, r: Reading) -> None:
    """accelerate's ``parallelism_config`` ``parallelism_config_sp_size`` (its only sp_backend is
    DeepSpeed's Ulysses); tp and cp sizes are planner/check/job_files.py's (not modelled)."""
    if not job.accelerate_where:
        return
    block = job.accelerate.get("parallelism_config")
    where = f"{job.accelerate_where}: parallelism_config"
    sp = r.typed(block, "parallelism_config_sp_size", (int,), where) if isinstance(block, dict) else None
    if sp is None or sp == 1:
        r.set("sequence_parallel", SequenceParallel.NONE, f"{where}: no sp_size above 1")
        return
    r.set("sequence_parallel", SequenceParallel.ULYSSES, f"{where}: sp_size {sp} (sp_backend deepspeed)")
    r.set("sp_size", sp, f"{where}: parallelism_config_sp_size")


def describe(get) -> str:
    """'' without sequence parallelism (it goes without saying), else "ulysses x8"."""
    value = get("sequence_parallel")
    return "" if value in (None, SequenceParallel.NONE) else f"ulysses x{get('sp_size')}"


STRATEGY = Strategy(
    "sequence_parallel", SequenceParallel, SequenceParallel.NONE, order=10, short="sp",
    help="sequence parallelism: none, or ulysses (DeepSpeed ALST: each sequence split over --sp-size GPUs, "
         "attention heads split for the attention); named, not searched",
    check=_check, time=_time, emit=_emit, read=_read, settings=SETTINGS, describe=describe, records=CHOICES,
)
