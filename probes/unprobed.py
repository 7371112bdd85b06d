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


def refuse_ring(config) -> None:
    """A ring-attention plan (torch context parallelism): its dispatcher has no sharding rule for
    the CPU attention kernel, so it runs neither on the CPU nor on fake tensors, and a measured
    probe runs one GPU, not the group whose keys and values it gathers (PlannerInputError). Its rows
    are analytic (planner/cost/sequence.py, measured on torch's ring functions:
    benchmarks/ring_attention_transients.py)."""
    if str(getattr(config, "sequence_parallel", "none")) == "ring":
        raise PlannerInputError("--sequence-parallel ring is not probed: torch's ring attention has no CPU kernel "
                                "rule (no trace) and needs its group's GPUs (no one-GPU measurement); its rows are "
                                "analytic",
                                hint="Probe the same plan with --sequence-parallel ulysses (ZeRO), whose rank holds "
                                     "the same tokens, or launch it and watch the first steps' memory.")


def refuse_tensor_parallel(config) -> None:
    """A tensor-parallel plan, measured: the measured probe runs one GPU, not the group whose
    collectives each layer runs (PlannerInputError). The traced probe runs it: transformers' own
    split and FSDP2 units under a fake process group (probes/model_setup.py ``distributed_model``)."""
    if str(getattr(config, "tensor_parallel", "none")) != "none":
        raise PlannerInputError("--tensor-parallel transformers is not measured: the measured probe runs one GPU, not "
                                "the group each layer's collectives need",
                                hint="Trace it (--fidelity traced), or launch it and watch the first steps' memory.")
