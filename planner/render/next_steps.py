"""The last lines of every planning screen: what to run next, as commands to copy.

A command is written from ``Asked``, the user's own command line in words (the command line builds
it from its options), so the next command keeps every restriction the answer rests on."""

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from planner.core.vocabulary import DEFAULT_SEQ_LEN
from planner.render.layout import command, line
from planner.strategies.method import trl_emittable

PLAN_DIR = "plan"  # where the next command writes launch files when the user named no directory
RUN_WORDS = ["MODEL=path/to/model", "DATA=path/to/train.jsonl"]  # launch.sh needs both


@dataclass(frozen=True)
class Asked:
    """How the user asked: --model, --gpus, the other target flags (margin, host RAM, network), and
    this command's own flags that shape the answer, as command-line words."""

    model: str | None  # None: the model the job's recipe names (check)
    gpus: str
    target: tuple[str, ...] = ()  # --margin 0.1, --host-memory-gb 64, ...
    options: tuple[str, ...] = ()  # --optimizer adamw, --seq-len 4096, ...
    out: Path | None = None  # suggest --out
    job_dir: Path | None = None  # check --job-dir

    @classmethod
    def of(cls, plan) -> "Asked":
        """From a plan alone (its model and GPUs), when the command line is not known."""
        return cls(model=plan.model.id, gpus=plan.hardware.spec)

    def target_words(self, gpus: str | None = None, host_memory_gb: float | None = None) -> list[str]:
        """--model, --gpus and the other target flags; ``gpus`` and ``host_memory_gb`` replace the user's."""
        rest = list(self.target)
        if host_memory_gb is not None:
            rest = [*_without(self.target, "--host-memory-gb"), "--host-memory-gb", f"{host_memory_gb:g}"]
        model = ["--model", self.model] if self.model is not None else []  # (check: the recipe names it)
        return [*model, "--gpus", gpus or self.gpus, *rest]


def suggest_next(result, asked: Asked | None, console: Console) -> None:
    """Fits: write the winner's files, run them, re-check them. Nothing fits: plan for the
    hardware where a plan fits, or with fewer restrictions."""
    if asked is None:
        if not result.plans:
            return
        asked = Asked.of(result.plans[0])
    console.print()
    if result.fits and result.plans and str(result.plans[0].config.method) == "grpo":
        where, plan = asked.out or Path(PLAN_DIR), result.plans[0]
        line(console, "next: write the winner's files, run them on your prompts with your reward function "
                      "(PLAN.md says how), re-check them after an edit:")
        if asked.out is None:
            command(console, ["planner", "suggest", *asked.target_words(), *asked.options, "--out", PLAN_DIR])
        command(console, ["MODEL=path/to/model", "DATA=path/to/prompts.jsonl", str(where / "launch.sh"),
                          "--reward", "my_rewards:accuracy"])
        # a server plan trains on the GPUs the server leaves; check reads its files on those
        server = str(plan.config.generation) == "vllm-server"
        extra = ["--vllm-gpus", str(plan.config.vllm_gpus)] if server else []
        command(console, ["planner", "check", "--job-dir", str(where),
                          *asked.target_words(plan.hardware.spec if server else None), *extra])
        return
    if result.fits and result.plans and not trl_emittable(result.plans[0].config):
        _not_emitted(result.plans[0].config, asked, "suggest", console)
        return
    if result.fits:
        where = asked.out or Path(PLAN_DIR)
        if asked.out is None:
            line(console, "next: write the winner's launch files, run them (MODEL: your model folder, DATA: "
                          "your JSONL), re-check them after an edit:")
            command(console, ["planner", "suggest", *asked.target_words(), *asked.options, "--out", PLAN_DIR])
        else:
            line(console, f"next: run the winner's launch files in {where} (MODEL: your model folder, DATA: your "
                          "JSONL), re-check them after an edit:")
        command(console, [*RUN_WORDS, str(where / "launch.sh")])
        command(console, ["planner", "check", "--job-dir", str(where), *asked.target_words()])
        return
    others = getattr(result, "hardware_suggestions", [])[:2]
    if others:
        line(console, "next: plan for hardware where a plan fits:")
        for s in others:
            command(console, ["planner", "suggest", *asked.target_words(s.gpus, getattr(s, "host_memory_gb", None)),
                              *asked.options])
        return
    numerics = getattr(result, "numerics", None)
    if getattr(numerics, "value", numerics) == "exact":
        line(console, "next: let the least approximation in when no exact plan fits:")
        command(console, ["planner", "suggest", *asked.target_words(), *_without(asked.options, "--numerics")])
    elif asked.options:
        line(console, "next: no catalog hardware makes a plan fit with these restrictions; without them:")
        command(console, ["planner", "suggest", *asked.target_words()])
    else:
        line(console, "next: no catalog hardware makes a plan fit; a smaller model:")
        command(console, ["planner", "models"])


def estimate_next(result, asked: Asked | None, console: Console) -> None:
    """Fits: write its launch files (emit reads estimate's JSON), or search for faster plans.
    Otherwise: search for a plan that fits."""
    asked = asked or Asked.of(result)
    console.print()
    if result.fits and not trl_emittable(result.config):
        _not_emitted(result.config, asked, "estimate", console)
        return
    if result.fits:
        line(console, "next: write this plan's launch files, or search for faster plans:")
        command(console, ["planner", "estimate", *asked.target_words(), *asked.options, "--json", ">", "plan.json"])
        command(console, ["planner", "emit", "--plan", "plan.json", "--out", PLAN_DIR])
        command(console, ["planner", "suggest", *asked.target_words(), *method_words(result.config),
                          *workload_words(result.config, asked.options)])
    else:
        line(console, "next: search for a plan that fits, and write its launch files:")
        command(console, ["planner", "suggest", *asked.target_words(), *method_words(result.config),
                          *workload_words(result.config, asked.options), "--out", PLAN_DIR])


def method_words(config) -> list[str]:
    """The flags that keep a plan's training method in a new search (its adapter and the settings
    it changed: a search without them plans full fine-tuning)."""
    from planner.strategies import TECHNIQUES, TrainingConfig

    words = []
    for s in TECHNIQUES:
        if (s.any_choice or s.named) and str(getattr(config, s.field)) != str(s.default):
            words += [s.flag, str(getattr(config, s.field))]
            words += [w for x in s.settings if getattr(config, x.name) != TrainingConfig.model_fields[x.name].default
                      for w in (x.flag, str(getattr(config, x.name)))]
    return words


def check_next(result, asked: Asked | None, console: Console) -> None:
    """Fits: run it (a planner job directory's launch.sh), or search for faster plans. Will not
    fit: a change above, or a plan that fits."""
    asked = asked or Asked.of(result.estimate)
    console.print()
    launch = asked.job_dir / "launch.sh" if asked.job_dir is not None else None
    if result.fits and launch is not None and launch.exists():
        line(console, "next: run it (MODEL: your model folder, DATA: your JSONL), or search for faster plans:")
        command(console, [*RUN_WORDS, str(launch)])
    elif result.fits:
        line(console, "next: launch the job as it is, or search for faster plans:")
    else:
        line(console, "next: make one of the changes above, or search for a plan that fits:")
    command(console, ["planner", "suggest", *asked.target_words(), *method_words(result.estimate.config),
                      *workload_words(result.estimate.config, asked.options)])


#: The flags of a job's workload a search keeps (its rows: their length and how they are batched).
WORKLOAD_FLAGS = ("--seq-len", "--batching", "--lengths")


def workload_words(config, options: tuple[str, ...]) -> list[str]:
    """The flags that keep a plan's workload in a new search: those the user gave, else the plan's
    sequence length where it is not the default and its batching where it is not packed (a search
    without them plans another job: 2,048-token packed rows)."""
    given = {w: options[i + 1] for i, w in enumerate(options[:-1]) if w in WORKLOAD_FLAGS}
    if "--seq-len" not in given and config.seq_len != DEFAULT_SEQ_LEN:
        given["--seq-len"] = str(config.seq_len)
    if "--batching" not in given and "--lengths" not in given and str(config.batching) != "packed":
        given["--batching"] = str(config.batching)
    return [w for flag in WORKLOAD_FLAGS if flag in given for w in (flag, given[flag])]


def _without(words: tuple[str, ...], flag: str) -> list[str]:
    """``words`` less ``flag`` and its value."""
    out, skip = [], False
    for w in words:
        if skip:
            skip = False
        elif w == flag:
            skip = True
        else:
            out.append(w)
    return out


def _not_emitted(config, asked: Asked, verb: str, console: Console) -> None:
    """A plan planner's files cannot run (LLaMA-Factory's DPO): run it with its own trainer, or plan
    the job as TRL's DPOTrainer runs it, which planner writes files for."""
    line(console, f"next: run it with llamafactory-cli (per_device_train_batch_size {config.micro_batch_size}, "
                  f"gradient_accumulation_steps {config.grad_accum}, cutoff_len {config.seq_len}); planner writes "
                  "files for TRL's DPOTrainer only. Plan the job for TRL:")
    options = _without(tuple(_without(asked.options, "--dpo-logprobs")), "--dpo-reference")
    command(console, ["planner", verb, *asked.target_words(), *options, "--dpo-logprobs", "fused"])
