"""The files a plan is emitted as, while strategies fill them in (core type; no I/O here).

Each strategy writes its piece of each file (DESIGN.md: a strategy owns its fragment of every
emitted file); planner.emit adds the plan-wide keys and writes them.
"""

from dataclasses import dataclass, field


@dataclass
class EmitDraft:
    accelerate: dict = field(default_factory=dict)  # accelerate_config.yaml
    deepspeed: dict | None = None  # deepspeed_config.json (ZeRO plans only)
    training_args: dict = field(default_factory=dict)  # training_args.json (transformers.TrainingArguments)
    runtime: dict = field(default_factory=dict)  # runtime.json (planner.core.launch_contract.RuntimeArgs)
    extras: set[str] = field(default_factory=set)  # pip extras of planner the launch needs (pyproject.toml)
    notes: list[str] = field(default_factory=list)  # what the user must do beyond the files (PLAN.md)

    def deepspeed_config(self) -> dict:
        """deepspeed_config.json of a ZeRO plan (planner/emit/files.py makes it before the
        strategies write theirs)."""
        if self.deepspeed is None:
            raise ValueError("deepspeed_config.json is written for ZeRO plans only")
        return self.deepspeed

    def fsdp(self) -> dict:
        return self.accelerate.setdefault("fsdp_config", {})

    def trainer_fsdp(self) -> dict:
        return self.training_args.setdefault("fsdp_config", {})
