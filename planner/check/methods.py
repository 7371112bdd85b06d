"""The training method a job's files name where it is not supervised fine-tuning: preference
optimization (DPO, KTO, ORPO, CPO/SimPO), reward modelling, reinforcement learning with sampled
generations (GRPO, RLOO, PPO, online DPO) and distillation (GKD).

planner plans supervised fine-tuning, and DPO, GRPO and KTO as TRL >= 1.15 runs them
(strategies/method.py, strategies/generation.py). The other methods hold what it does not count:
a reference model beside other batches, a reward or value model, or a teacher. Planned as
supervised fine-tuning, their verdict would under-count memory, so ``planner check`` refuses them
and says why (exit 2).
"""

from planner.core import job as job_module
from planner.core.trl_recipes import TRL_MARKERS, grpo_recipe, marker
from planner.cost.preference import fused_logprobs
from planner.strategies.method import DPO_ONLY, KTO_ONLY

#: The marker entry of the keys DPO and ORPO share (``--method dpo`` settles it).
DPO_OR_ORPO = next(method for method, _ in TRL_MARKERS if method.startswith("DPO or ORPO"))
#: TRL SFTConfig's ``loss_type`` values; any other names a preference or RL loss ("sigmoid", "ipo",
#: "grpo", "dr_grpo", ...), as the DPO, KTO and GRPO configs use the key.
SFT_LOSS_TYPES = frozenset({"nll", "dft", "chunked_nll"})
#: LLaMA-Factory's ``stage`` values planner does not plan (src/llamafactory/hparams/finetuning_args.py:
#: pt, sft, rm, ppo, dpo, kto; dpo is planned: strategies/method.py).
LLAMAFACTORY_STAGES = {"rm": "a reward model (chosen and rejected sequences)",
                       "ppo": "PPO (a policy, a reference, a reward and a value model; completions sampled every step)",
                       "kto": "LLaMA-Factory's own KTO trainer (full logits, a reference model); TRL's KTOConfig "
                              "recipes are planned"}
#: LLaMA-Factory's ``pref_loss`` values (hparams/finetuning_args.py): each from the same
#: log-probabilities, orpo and simpo without a reference.
LLAMAFACTORY_PREF_LOSSES = ("sigmoid", "hinge", "ipo", "kto_pair", "orpo", "simpo")
#: axolotl's ``rl`` values that train with TRL's DPOTrainer (``rl: ipo`` is DPOConfig's loss_type ipo:
#: the same log-probabilities, the same memory), planned as DPO (planner/check/frameworks.py).
AXOLOTL_DPO = ("dpo", "ipo")
#: axolotl ``dpo_*`` keys of a DPOTrainer path planner does not model: the flag and why.
AXOLOTL_DPO_UNMODELLED = {
    "dpo_padding_free": "padding-free DPO (DPOConfig padding_free: the pairs packed into one row)",
    "dpo_use_liger_kernel": "Liger's fused DPO loss (DPOConfig use_liger_kernel)",
}
#: Why axolotl's other ``rl`` trainers are refused (core/builders/rl.py picks each).
AXOLOTL_RL = {
    "orpo": "TRL's ORPOTrainer, which takes log-probabilities from the full logits",
    "simpo": "TRL's CPOTrainer with loss_type simpo, which takes log-probabilities from the full logits",
    "gdpo": "axolotl's GDPO, on TRL's GRPOTrainer",
}
#: ``rl: grpo``'s ``trl:`` keys and top-level keys that leave TRL's GRPOTrainer (core/builders/rl.py,
#: core/trainers/grpo/__init__.py ``GRPOStrategy``): the key and what axolotl then runs.
AXOLOTL_GRPO_UNMODELLED = {
    "trl.use_data_producer": "axolotl's asynchronous GRPO trainer (FastAsyncGRPOTrainer: generation overlapped with "
                             "training, a replay buffer)",
    "trl.async_prefetch": "axolotl's asynchronous GRPO trainer (generation of the next batch during this one)",
    "trl.use_liger_loss": "Liger's fused GRPO loss",
    "trl.vllm_lora_sync": "the adapter synced to vLLM's LoRA slots instead of merged weights",
    "batch_flattening": "padding-free rows (batch_flattening)",
}
#: What every refusal ends with.
REFUSAL = ("planner plans supervised fine-tuning, DPO (TRL's, axolotl's, LLaMA-Factory's), GRPO "
           "and KTO (TRL's, axolotl's) only: planned as one of them, this job's memory would be under-counted")
#: What to do next when every problem is such a refusal.
REFUSAL_HINT = ("Other preference and RL training is not planned yet; planner check plans supervised fine-tuning "
                "(a TRL SFT or Trainer recipe, LLaMA-Factory stage sft or pt, axolotl without rl), DPO (a DPOConfig "
                "recipe, or --method dpo; axolotl rl dpo or ipo; LLaMA-Factory stage dpo, its pref_loss orpo and "
                "simpo too), GRPO (a GRPOConfig recipe; axolotl rl grpo) and KTO (a KTOConfig recipe; axolotl rl "
                "kto).")


def trl_method(d: dict, where: str, named: str | None = None) -> str | None:
    """The refusal for a Trainer/TRL recipe ``d`` of a method planner does not plan (None: SFT, or
    DPO named by a key only DPOConfig has, which strategies/method.py reads, or by ``named``
    (``--method dpo``) where the recipe's keys are those DPO and ORPO share, under a TRL that
    computes its log-probabilities with the fused head, the one modelled): the keys that say so
    and the method they name."""
    found = marker(d)
    if grpo_recipe(d):
        return _unmodelled_grpo(d, where)
    if any(k in d for k in DPO_ONLY) or (named == "dpo" and found is not None and found[0] == DPO_OR_ORPO):
        return _unfused_trainer(where)
    if kto := [k for k in KTO_ONLY if k in d]:
        if named not in (None, "kto"):
            return f"{where}: {', '.join(kto)}: a KTOConfig recipe, not --method {named}: {REFUSAL}"
        return _unfused_trainer(where, "a KTO recipe", "KTOTrainer")
    if found is not None:
        return f"{where}: {', '.join(found[1])}: {found[0]}: {REFUSAL}"
    loss = d.get("loss_type")
    names = loss if isinstance(loss, list) else [loss]
    if loss is not None and any(str(n) not in SFT_LOSS_TYPES for n in names):
        return (f"{where}: loss_type {loss}: a preference or RL loss (TRL's SFT trainer takes nll, dft or chunked_nll): "
                f"{REFUSAL}")
    return None


def _unfused_trainer(where: str, what: str = "a DPO recipe", trainer: str = "DPOTrainer") -> str | None:
    """The refusal for a DPO (or KTO: ``trainer``) job under a TRL whose trainer computes its
    log-probabilities from the full logits (before 1.15, for both; None: the fused LM head, which is
    modelled, or no TRL installed)."""
    trl = job_module.installed_release("trl")
    if trl is None or fused_logprobs(trl):
        return None
    return (f"{where}: {what} under the TRL installed here ({'.'.join(map(str, trl))}), whose {trainer} "
            f"computes log-probabilities from the full logits (before 1.15): not modelled; {REFUSAL}")


def _unmodelled_grpo(d: dict, where: str) -> str | None:
    """The refusal for a GRPO recipe planner does not model (None: planned): under a TRL before the
    fused LM head."""
    trl = job_module.installed_release("trl")
    if trl is not None and not fused_logprobs(trl):
        return (f"{where}: a GRPO recipe under the TRL installed here ({'.'.join(map(str, trl))}), whose GRPOTrainer "
                f"computes log-probabilities from the logits (before 1.15): not modelled; {REFUSAL}")
    return None


def _axolotl_grpo(d: dict, where: str) -> str | None:
    """The refusal for axolotl's ``rl: grpo`` where it does not run TRL's GRPOTrainer as modelled
    (``AXOLOTL_GRPO_UNMODELLED``), or under a TRL before the fused LM head; None: planned."""
    block = d.get("trl")
    trl: dict = block if isinstance(block, dict) else {}
    for key, what in AXOLOTL_GRPO_UNMODELLED.items():
        nested, _, name = key.rpartition(".")
        value = (trl if nested else d).get(name)
        if value is True:
            return f"{where}: {key}: {what}: not modelled; {REFUSAL}"
    return _unmodelled_grpo(d, where)


def framework_method(llamafactory: bool, d: dict, where: str) -> str | None:
    """The refusal for a LLaMA-Factory file of a stage other than pt and sft, or an axolotl file
    with ``rl`` or a reward model (None: supervised fine-tuning)."""
    if llamafactory:
        stage = d.get("stage")
        if isinstance(stage, str) and stage.lower() in LLAMAFACTORY_STAGES:
            return f"{where}: stage {stage}: {LLAMAFACTORY_STAGES[stage.lower()]}: {REFUSAL}"
        if stage == "dpo" and d.get("ref_model"):
            return (f"{where}: ref_model: a reference model other than the policy (its size, and "
                    f"ref_model_quantization_bit's, are not read): not modelled; {REFUSAL}")
        if stage == "dpo" and d.get("pref_loss", "sigmoid") not in LLAMAFACTORY_PREF_LOSSES:
            return f"{where}: pref_loss {d['pref_loss']}: one of {', '.join(LLAMAFACTORY_PREF_LOSSES)}; {REFUSAL}"
        return None
    rl = d.get("rl")
    if rl == "grpo":
        return _axolotl_grpo(d, where)
    if rl == "kto":
        return _unfused_trainer(where, "rl kto (TRL's KTOTrainer)", "KTOTrainer")
    if rl in AXOLOTL_DPO:
        for key, what in AXOLOTL_DPO_UNMODELLED.items():
            if d.get(key) is True:
                return f"{where}: {key}: {what}: not modelled; {REFUSAL}"
        return _unfused_trainer(where, f"rl {rl} (TRL's DPOTrainer)")
    if rl not in (None, False, "", "none"):
        why = AXOLOTL_RL.get(str(rl).lower(), "preference or RL training, through TRL")
        return f"{where}: rl {rl}: axolotl's {rl} trainer ({why}): {REFUSAL}"
    for key in ("reward_model", "process_reward_model"):
        if d.get(key) is True:
            return f"{where}: {key}: a reward model (chosen and rejected sequences): {REFUSAL}"
    return None
