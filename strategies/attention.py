"""Attention implementation: sdpa (fused: flash / memory-efficient kernels) or eager.

Its memory effect lives in planner.cost.activations (fused attention saves no s^2 tensor;
eager saves fp32 softmax probabilities, a*s per token), read through the plan layout's
``fused_attention``. Here: when a choice is unwise, its time, its model keyword (runtime.json).
"""

from dataclasses import dataclass
from enum import StrEnum

from planner.core.emitted import EmitDraft
from planner.core.job import JobFiles, Reading
from planner.core.ledger import LedgerDraft, PagedInfo
from planner.core.timing import TimeDraft, Window
from planner.strategies import rates
from planner.strategies.base import Check, Choice, PlanContext, Strategy


class Attention(StrEnum):
    SDPA = "sdpa"
    EAGER = "eager"


@dataclass(frozen=True)
class AttentionChoice(Choice):
    """One attention value: ``fused`` kernels save no s^2 tensor (planner.cost.activations reads the
    layout's ``fused_attention``); ``reads``: the transformers attn_implementation names read as it
    (flash-attn kernels are fused like SDPA's)."""

    fused: bool
    reads: tuple[str, ...]


#: Every attention value; eager is not transformers' default kernel: the runtime sets it.
CHOICES: dict[Attention, AttentionChoice] = {
    Attention.SDPA: AttentionChoice("fused flash / memory-efficient kernels (torch SDPA)", True,
                                    ("sdpa", "flash_attention_2", "flash_attention_3")),
    Attention.EAGER: AttentionChoice("materialises the s^2 scores per head", False, ("eager",), complexity=1,
                                     runtime_only=True),
}


#: Families whose transformers class has no SDPA path (Gemma2ForCausalLM raises ValueError on
#: attn_implementation="sdpa" in transformers 5; found by the traced probe).
NO_SDPA = frozenset({"gemma2"})


def _check(ctx: PlanContext, out: Check) -> None:
    m, a = ctx.model, ctx.config.attention
    if a == Attention.SDPA and m.family in NO_SDPA:
        out.reject(
            "sdpa unsupported by the model",
            f"{m.family}: transformers' model class refuses attn_implementation='sdpa' (attention-logit "
            "soft-capping); use --attention eager",
        )
    elif a == Attention.SDPA and m.attn_logit_softcapping:
        out.warnings.append(
            f"{m.family}: SDPA ignores attention-logit soft-capping ({m.attn_logit_softcapping}); "
            "transformers recommends eager attention for training this model"
        )
    if a == Attention.EAGER and ctx.config.seq_len >= 4096:
        out.warnings.append("eager attention materialises s^2 scores per head; sdpa is faster and saves that memory")


def _storage(ctx: PlanContext, decided: dict) -> dict:
    """Fused attention saves no s^2 tensor (planner.cost.activations reads this)."""
    return {"fused_attention": CHOICES[ctx.config.attention].fused}


def _time(ctx: PlanContext, ledger: LedgerDraft, paged: PagedInfo | None, draft: TimeDraft) -> None:
    fwd = rates.attention_forward_seconds(ctx)
    how = "fused, causal blocks skipped" if ctx.config.attention == Attention.SDPA else "eager, full s^2"
    draft.compute("attention", f"attention forward ({how})", fwd, Window.FORWARD)
    draft.compute("attention", f"attention backward ({how})", 2 * fwd, Window.BACKWARD)


def _emit(ctx: PlanContext, files: EmitDraft) -> None:
    """transformers' attn_implementation, which no Trainer key says: runtime.json."""
    files.runtime["attn_implementation"] = str(ctx.config.attention)


#: transformers attn_implementation names -> vocabulary (the records' ``reads``).
READS = {name: a for a, c in CHOICES.items() for name in c.reads}


def _read(job: JobFiles, r: Reading) -> None:
    """runtime.json's attn_implementation (transformers loads sdpa when nothing says otherwise), or
    a TRL recipe's (``ModelConfig.attn_implementation``)."""
    sources: list[tuple[dict, str, str | None]] = [(job.runtime, job.runtime_where, "sdpa")] if job.runtime_where else []
    if job.training_args_where and "attn_implementation" in job.training_args:
        sources.append((job.training_args, job.training_args_where, None))
    for d, where, default in sources:
        name = d.get("attn_implementation", default)
        if isinstance(name, str) and name in READS:
            r.set("attention", READS[name], f"{where}: attn_implementation {name}")
        elif name is not None:
            r.problems.append(f"{where}: attn_implementation {name!r} is not one of {', '.join(READS)}")


def _twin(combo) -> Attention | None:
    """Eager's twin is SDPA: the s^2 scores it saves make it no smaller and its unfused kernels no
    faster. Not under selective checkpointing, whose policy (torchtitan's) saves SDPA's outputs
    and recomputes eager's attention: there eager holds less."""
    if combo["attention"] == Attention.EAGER and combo["checkpointing"] != "selective":
        return Attention.SDPA
    return None


STRATEGY = Strategy(
    "attention", Attention, Attention.SDPA, order=6, short="attn", twin=_twin,
    help="attention kernels: sdpa (fused flash / memory-efficient) or eager (materialises s^2 scores)",
    check=_check, time=_time, emit=_emit, read=_read, storage=_storage, runtime="planner.runtime.attention",
    records=CHOICES,
)
