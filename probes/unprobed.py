"""Plans the probes do not run, refused with the reason: both the traced and the measured probe
run the model's own loss in their own training loop, not a trainer of another method."""

from planner.core.errors import PlannerInputError
from planner.strategies.method import dpo, grpo


def refuse_method(config) -> None:
    """A DPO or GRPO plan: its reference forward, generation and TRL's fused LM head run only
    inside TRL's trainers, which neither probe builds (PlannerInputError)."""
    if grpo(config):
        raise PlannerInputError("--method grpo is not probed: the probes run the model's own loss in their own loop, "
                                "not TRL's GRPOTrainer (its generation, scoring forwards and fused LM head)",
                                hint="Probe a GRPO plan's SFT twin (--method sft --generation none) for the training "
                                     "side.")
    if dpo(config):
        raise PlannerInputError("--method dpo is not probed: the probes run the model's own loss in their own loop, "
                                "not TRL's DPOTrainer (its reference forward and fused LM head)",
                                hint="Check a DPO plan by launching it (its live check compares the run with the "
                                     "plan), or probe its SFT twin (--method sft).")
