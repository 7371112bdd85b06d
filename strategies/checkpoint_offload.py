"""Activation-checkpoint offload: none, or host (each checkpointed layer's input held in pinned host
RAM from its forward to its backward).

Under full checkpointing a layer keeps only its input until its backward (strategies/
checkpointing.py ``per_layer_forward_bytes``): ``layers x tokens x hidden`` bytes, what dominates at
long sequences. Offloaded, ``torch.autograd.graph.save_on_cpu(pin_memory=True)`` around each
layer's checkpoint packs every tensor the checkpoint saves for its recompute into a pinned host
buffer (a blocking copy on the compute stream in forward) and unpacks it to the GPU when the
layer's backward recomputes it (a copy on the compute stream): the GPU keeps none of them (a
quantized base's matmul inputs, which bitsandbytes keeps outside autograd, stay), the host holds
them per rank, and each copy adds its time to the step.

Which tensors: the checkpoint's saved inputs. transformers' own checkpointing
(``GradientCheckpointingLayer``) passes a layer's keyword arguments bound in a partial, so only the
hidden states are saved (``activations.layer_input_bytes``); FSDP's own (accelerate's
``checkpoint_wrapper``, non-reentrant) saves the keyword tensors too, so each layer also packs its
own host copy of the rotary cos and sin (2 x head_dim per token, in the residual's dtype).

Sources: transformers 5.24 ``modeling_utils.PreTrainedModel._activation_checkpointing_enable``
(``offload``: ``save_on_cpu(pin_memory=True)`` around ``checkpoint``; "frees layers x sequence x
hidden bytes of device memory ... costs a device-to-host copy in the forward and a host-to-device
copy in the backward. Both copies run on the compute stream"), ``trainer.py`` (the
``activation_checkpointing_kwargs`` key ``offload``); accelerate 1.15 ``utils/fsdp_utils.py``
``fsdp2_apply_ac`` (``offload_wrapper`` around ``checkpoint_wrapper``), ``utils/dataclasses.py``
(``activation_checkpointing_offload`` needs activation checkpointing and FSDP2); torch 2.13
``autograd/graph.py`` ``save_on_cpu``, ``utils/checkpoint.py`` (``_NoopSaveInputs`` saves args and
kwargs). Measured (accelerate PR #4175): Qwen3-0.6B at 1,048,576 tokens over 8 ranks, "27.9 GB to
20.8 GB ... the 7.1 GB saved matches the 7.5 GB of boundary inputs".
"""

from enum import StrEnum

from planner.core.emitted import EmitDraft
from planner.core.job import JobFiles, Reading
from planner.core.ledger import ALL_PHASES, LedgerDraft, Location, PagedInfo
from planner.core.timing import TimeDraft, Window
from planner.core.vocabulary import LONG_SEQUENCE_TOKENS
from planner.cost import comms, overheads
from planner.strategies.base import Check, Choice, Engine, PlanContext, Strategy, unsaid_default
from planner.strategies.checkpointing import Checkpointing, fsdp_checkpoints, offloaded_input_bytes


class CheckpointOffload(StrEnum):
    NONE = "none"
    HOST = "host"


CHOICES: dict[CheckpointOffload, Choice] = {
    CheckpointOffload.NONE: Choice("checkpointed layers keep their inputs on the GPU"),
    # (searched where sequences are long: planner/engine/degrees.py)
    CheckpointOffload.HOST: Choice("each checkpointed layer's input in pinned host RAM until its backward",
                                   complexity=1, searched=False),
}


def _check(ctx: PlanContext, out: Check) -> None:
    if ctx.config.checkpoint_offload != CheckpointOffload.HOST:
        return
    if ctx.config.checkpointing != Checkpointing.FULL:
        out.reject("checkpoint offload without full checkpointing", "checkpoint offload moves the inputs full "
                   "checkpointing keeps; with --checkpointing none or selective there are none: use "
                   "--checkpointing full")
    elif ctx.engine == Engine.FSDP and ctx.config.fsdp_version != 2 and fsdp_checkpoints(ctx):
        out.reject("checkpoint offload under fsdp1", "accelerate offloads FSDP's checkpointed inputs under FSDP2 only "
                   "(activation_checkpointing_offload): use --fsdp-version 2")


def _apply(ctx: PlanContext, ledger: LedgerDraft) -> None:
    per_token = offloaded_input_bytes(ctx)
    if not per_token:
        return
    layers, tokens = ctx.model.num_layers, ctx.config.tokens_per_micro_batch
    ledger.add("activations", f"checkpointed layers' inputs, {layers} layers (pinned host RAM)", per_token * layers,
               tokens, phases=ALL_PHASES, location=Location.HOST,
               note=f"{per_token:,.0f} B/token/layer x {tokens:,} tokens, per rank")


def transfer_seconds(ctx: PlanContext) -> float:
    """One pass's copies of every layer's checkpointed inputs over the host link (forward down,
    backward up: the same bytes), at ``HOST_LINK_EFFICIENCY``. Unit: seconds per micro-batch."""
    n_bytes = offloaded_input_bytes(ctx) * ctx.model.num_layers * ctx.config.tokens_per_micro_batch
    return comms.transfer_seconds(n_bytes, ctx.hardware.gpu.host_link_bytes_per_s, overheads.HOST_LINK_EFFICIENCY)


def _time(ctx: PlanContext, ledger: LedgerDraft, paged: PagedInfo | None, draft: TimeDraft) -> None:
    seconds = transfer_seconds(ctx)
    if not seconds:
        return
    draft.compute("offload", "checkpointed inputs to host (forward)", seconds, Window.FORWARD,
                  note="on the compute stream: the forward waits for each copy")
    draft.compute("offload", "checkpointed inputs back to GPU (backward)", seconds, Window.BACKWARD)


def _emit(ctx: PlanContext, files: EmitDraft) -> None:
    """FSDP's own checkpointing: accelerate's ``fsdp_activation_checkpointing_offload`` (and the
    Trainer's FSDP config's); the Trainer's: ``offload`` in its ``activation_checkpointing_kwargs``
    (strategies/checkpointing.py writes the rest of them)."""
    if ctx.config.checkpoint_offload != CheckpointOffload.HOST:
        return
    if fsdp_checkpoints(ctx):
        files.fsdp()["fsdp_activation_checkpointing_offload"] = True
        files.trainer_fsdp()["activation_checkpointing_offload"] = True
    else:
        files.training_args.setdefault("activation_checkpointing_kwargs", {})["offload"] = True


def _read(job: JobFiles, r: Reading) -> None:
    """``offload`` in the Trainer's (activation / gradient) checkpointing kwargs, or FSDP's
    ``activation_checkpointing_offload``; none where the files that would say it do not."""
    for fsdp in job.fsdp:
        if fsdp.get("activation_checkpointing_offload", False) in (True, "true"):
            r.set("checkpoint_offload", CheckpointOffload.HOST, f"{fsdp.file}: FSDP activation_checkpointing_offload")
            return
    if job.training_args_where:
        d, where = job.training_args, job.training_args_where
        for key in ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs"):
            kwargs = r.section(d, key, where)
            flag = r.typed(kwargs, "offload", (bool,), f"{where}: {key}")
            if isinstance(flag, bool):
                value = CheckpointOffload.HOST if flag else CheckpointOffload.NONE
                r.set("checkpoint_offload", value, f"{where}: {key} offload {flag}")
                return
    said = job.training_args_where or next((f.file for f in job.fsdp), None)
    if said:
        r.set("checkpoint_offload", CheckpointOffload.NONE, f"{said}: no checkpoint offload")


def _savers(c, hardware) -> list[tuple[str, dict]]:
    """The checkpointed inputs to host RAM, under full checkpointing (the callers keep it only
    where the peak falls and the host holds it)."""
    if c.checkpoint_offload != CheckpointOffload.NONE or c.checkpointing != Checkpointing.FULL:
        return []
    return [("checkpoint-offload none -> host", {"checkpoint_offload": CheckpointOffload.HOST})]


STRATEGY = Strategy(
    "checkpoint_offload", CheckpointOffload, CheckpointOffload.NONE, order=11, short="ckpt-off",
    help="activation-checkpoint offload under full checkpointing: none, or host (each layer's input in pinned host "
         "RAM, copied on the compute stream); searched at long sequences",
    check=_check, apply=_apply, time=_time, emit=_emit, read=_read, records=CHOICES, savers=_savers,
    describe=unsaid_default("checkpoint_offload", CheckpointOffload.NONE),
    searched_from=f"from {LONG_SEQUENCE_TOKENS:,} tokens",
)
