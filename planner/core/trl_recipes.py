"""Which TRL trainer a Trainer/TRL recipe is for, by the keys only that trainer's config has (a
fact about TRL's configs that the reader of the method, strategies/method.py, and ``planner check``'s
refusals, planner/check/methods.py, both need)."""

#: Keys of TRL's trainer configs that neither ``SFTConfig`` nor ``TrainingArguments`` has, and the
#: method each names; the first entry with a key the recipe holds decides (the sampling methods
#: before DPO: their configs have ``beta`` too; GKD and online DPO before GRPO, whose vLLM keys
#: online DPO shares). From TRL 1.16's dataclasses (tests/test_check_methods.py checks
#: every key the installed TRL has against its config), older releases' (``max_prompt_length``:
#: DPO/ORPO/KTO/CPO configs up to 1.14) and open-r1's GRPO script arguments (``reward_funcs``).
#: A key only DPOConfig has (strategies/method.py ``DPO_ONLY``) is read as DPO, which is planned;
#: a GRPO or RLOO recipe without RLOO's own keys (``RLOO_ONLY``) as GRPO, which is planned.
TRL_MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("GKD (TRL's GKDTrainer: distillation from a teacher model)", ("teacher_model_name_or_path", "lmbda", "seq_kd")),
    ("online DPO (TRL's OnlineDPOTrainer: completions sampled and judged every step)",
     ("missing_eos_penalty", "reward_model_path")),
    ("GRPO or RLOO (TRL's GRPOTrainer or RLOOTrainer: completions sampled every step, a reference model "
     "unless beta is 0)",
     ("num_generations", "steps_per_generation", "generation_batch_size", "num_iterations", "use_vllm", "vllm_mode",
      "vllm_gpu_memory_utilization", "reward_weights", "reward_funcs")),
    ("KTO (TRL's KTOTrainer: a reference model, desirable and undesirable completions)",
     ("desirable_weight", "undesirable_weight")),
    ("CPO or SimPO (TRL's CPOTrainer: chosen and rejected sequences)", ("cpo_alpha", "simpo_gamma")),
    ("a reward model (TRL's RewardTrainer: chosen and rejected sequences)", ("center_rewards_coefficient",)),
    ("DPO or ORPO (TRL's DPOTrainer: a reference model, chosen and rejected sequences; ORPOTrainer: the "
     "pairs; the keys do not say which: --method dpo, or f_divergence_type, DPOConfig's own key, plans it "
     "as DPO)",
     ("beta", "precompute_ref_log_probs", "precompute_ref_batch_size", "sync_ref_model", "ref_model_sync_steps",
      "ref_model_mixup_alpha", "max_prompt_length")),
)
#: The marker entry of GRPO's and RLOO's keys.
GRPO_OR_RLOO = next(method for method, _ in TRL_MARKERS if method.startswith("GRPO or RLOO"))
#: Keys RLOOConfig has and GRPOConfig has not (TRL 1.16): a recipe holding one is RLOO, refused.
RLOO_ONLY = ("normalize_advantages", "reward_clip_range")


def marker(d: dict) -> tuple[str, list[str]] | None:
    """The first ``TRL_MARKERS`` entry with a key in ``d``, and those keys."""
    return next(((method, [k for k in keys if k in d]) for method, keys in TRL_MARKERS if any(k in d for k in keys)),
                None)


def grpo_recipe(d: dict) -> bool:
    """Whether a Trainer/TRL recipe ``d`` is GRPO: GRPOConfig's keys (the GRPO/RLOO marker, no
    earlier method's), none only RLOOConfig has."""
    found = marker(d)
    return found is not None and found[0] == GRPO_OR_RLOO and not any(k in d for k in RLOO_ONLY)
