"""PLAN.md: why this plan, its memory and time breakdown, what was rejected, what to change
first if it runs out of memory, and how to run it."""

from planner.core import shell
from planner.core.distribution import install_line
from planner.core.emitted import EmitDraft
from planner.core.formatting import count, gib, share
from planner.core.launch_contract import RUNTIME_FILE, RuntimeArgs
from planner.core.ledger import Location, resident
from planner.core.lengths import Batching
from planner.engine.ranking import TIE_BAND
from planner.schema.estimate import Alternative, EstimateResult
from planner.strategies import approximation_words, summary
from planner.strategies.method import grpo


def _gib(n: float) -> str:
    return f"{n / 2**30:,.2f}"


def peak_words(plan: EstimateResult) -> str:
    """The peak as a user should read it: with paged optimizer state, the GPU memory it leaves
    for paging is used too ("X GiB + paged state fills the rest")."""
    if plan.peak_without_paged is not None:
        return f"{_gib(plan.peak_without_paged)} GiB + paged state fills the rest ({_gib(plan.memory['peak'])} GiB)"
    return f"{_gib(plan.memory['peak'])} GiB"


def render_plan_doc(plan: EstimateResult, search, rank: int, notes: list[str], draft: EmitDraft,
                    savers: list[Alternative], files: list[str]) -> str:
    c, hw, t, m = plan.config, plan.hardware, plan.time, plan.model
    gpus, model = shell.visible(hw.spec), shell.visible(m.id)  # (one line each, whatever the user named)
    out = [
        f"# Plan: {model} on {gpus}",
        "",
        f"{summary(c, 'markdown', ' · ')} · micro-batch {c.micro_batch_size} × "
        f"accumulation {c.grad_accum} × {hw.num_gpus} GPU(s) × {c.seq_len} tokens",
        "",
        "## Why this plan",
        "",
    ]
    fitting = search.considered - sum(search.rejected.values()) if search.engine != "estimate" else None
    if search.engine == "estimate":
        out.append("- Estimated as given (`planner estimate`); no search ranked it.")
    else:
        out.append(f"- Rank {rank} of {fitting:,} fitting plans among {search.considered:,} candidates "
                   f"({search.engine} search), ranked by numerics (`--numerics {search.numerics}`), then tokens/s; "
                   f"plans within {TIE_BAND:.0%} of the fastest are ties, given to the simpler plan.")
        if len(search.plans) > rank:
            nxt = search.plans[rank]
            out.append(f"- Next: {summary(nxt.config)}, micro-batch {nxt.config.micro_batch_size}: "
                       f"{nxt.time.tokens_per_second:,.0f} tokens/s at {_gib(nxt.memory['peak'])} GiB.")
    out.append("- Numerics: " + ("exact (the same math as fp32-master AdamW under mixed precision)." if not approximation_words(c)
                                  else "approximation: " + "; ".join(approximation_words(c))
                                  + ("" if search.exact_fits else " (no exact plan fits).")))
    for trade in search.trade_offs if rank == 1 else []:
        out.append(f"- Approximations would give {trade.gain:+.0%} ({trade.plan.time.tokens_per_second:,.0f} tokens/s): "
                   f"{'; '.join(trade.approximations)}; they change numerics (`--numerics any`).")
    out += [
        f"- {model}: {count(m.num_parameters)} parameters ({m.family}).",
        f"- Throughput {t.tokens_per_second:,.0f} tokens/s ({t.tokens_per_second_per_gpu:,.0f} per GPU), "
        f"MFU {t.mfu:.1%} (model FLOPs over the {t.mfu_basis}), {t.step_seconds:,.3f} s per optimizer step.",
        f"- Peak {peak_words(plan)} of {_gib(plan.usable_bytes)} GiB usable per GPU at the "
        f"{plan.peak_phase} phase ({_gib(plan.headroom_bytes)} GiB to spare); host RAM "
        f"{_gib(plan.host_memory['peak'])} of {_gib(plan.host_usable_bytes)} GiB usable per node "
        f"({_gib(plan.host_memory['capacity'])} GiB there).",
        *[f"- {r}" for r in plan.reasons],
        *([f"- Assumed: {'; '.join(search.assumptions)}."] if search.assumptions else []),
        "",
        f"## Memory per GPU at the {plan.peak_phase} peak",
        "",
        "| term | GiB | of GPU | how |",
        "|---|---:|---:|---|",
    ]
    for row in resident(plan.ledger, plan.peak_phase):
        out.append(f"| {row.label} | {_gib(row.bytes)} | {share(row.bytes, hw.gpu_memory_bytes)} | {row.note} |")
    out.append(f"| **peak** | **{_gib(plan.memory['peak'])}** | {share(plan.memory['peak'], hw.gpu_memory_bytes)} | |")
    out += ["", "Phases: " + ", ".join(f"{p} {gib(b)}" for p, b in plan.phase_peaks.items()) + ".", ""]
    host_rows = [r for r in plan.ledger if r.location == Location.HOST]
    if host_rows:
        out += ["On the host, per GPU: " + "; ".join(f"{r.label} {gib(r.bytes)}" for r in host_rows) + ".", ""]
    out += ["## Step time", "", "| term | s / step | share | before overlap |", "|---|---:|---:|---:|"]
    for row in t.rows:
        out.append(f"| {row.label} | {row.seconds:,.4f} | {share(row.seconds, t.step_seconds)} | {row.raw_seconds:,.4f} |")
    out += ["", "## What was rejected", ""]
    if search.rejected:
        out += ["| reason | candidates |", "|---|---:|"]
        out += [f"| {why} | {n:,} |" for why, n in search.rejected.items()]
    else:
        out.append("Nothing: this plan was estimated, not searched.")
    out += ["", "## If it runs out of memory", ""]
    lower = [(i, p) for i, p in enumerate(search.plans, 1) if i > rank and p.memory["peak"] < plan.memory["peak"]]
    if lower:
        i, p = lower[0]
        out += [f"The next plan down: rank {i}, {summary(p.config)}, micro-batch {p.config.micro_batch_size}: "
                f"peak {peak_words(p)}, {p.time.tokens_per_second:,.0f} tokens/s "
                f"(`planner suggest` with this plan's flags and `--json > ranked.json`, then "
                f"`planner emit --plan ranked.json --rank {i} --out DIR`: plan.json holds this plan only).", ""]
    if savers:
        out.append("Change first (exact changes first, then approximations; each fastest first and keeping the "
                   "global batch):")
        out.append("")
        for i, alt in enumerate(savers[:6], 1):
            r = alt.result
            out.append(f"{i}. {alt.change}: peak {_gib(plan.memory['peak'])} → {_gib(r.memory['peak'])} GiB, "
                       f"{r.time.tokens_per_second:,.0f} tokens/s")
    else:
        out.append("No single change of this plan lowers its peak further; use more or larger GPUs.")
    out += ["", *(how_to_run_grpo(draft, files, c) if grpo(c) else
                  how_to_run(draft, files, c.seq_len, c.batching, method=str(c.method)))]
    if notes or plan.warnings:
        out += ["", "Notes:", ""] + [f"- {shell.visible(n)}" for n in notes + plan.warnings]
    return "\n".join(out) + "\n"


#: How the launch turns the text into sequences, per batching (planner/launch/data.py).
DATA_WORDS = {
    Batching.PACKED: "the text is tokenised and packed into sequences of {n:,} tokens",
    Batching.PADDED: ("each document is tokenised as one sequence, truncated to {n:,} tokens, and each micro-batch "
                      "padded to its longest (the padding masked out of attention and loss)"),
    Batching.PADDED_MAX: ("each document is tokenised as one sequence, truncated to {n:,} tokens and padded to "
                          "{n:,} (the padding masked out of attention and loss)"),
}


#: What a DPO plan's launch trains on (planner/launch/data.py ``preference_pairs``).
DPO_DATA_WORDS = ("`DATA`: a JSONL file of preference pairs, each line with string `prompt`, `chosen` and `rejected` "
                  "fields; TRL's DPOTrainer tokenises each pair as two sequences (prompt + chosen, prompt + rejected) "
                  "cut at {n:,} tokens, and pads each micro-batch to its longest.")
KTO_DATA_WORDS = ("`DATA`: a JSONL file of unpaired completions, each line with `prompt` and `completion` (strings, "
                  "or lists of messages) and a boolean `label` (desirable or not); TRL's KTOTrainer tokenises each as "
                  "one sequence cut at {n:,} tokens, pads each micro-batch to its longest, and keeps the file's order "
                  "(its KL estimate pairs each completion with its neighbour's prompt).")
#: The TRL trainer each method's launch runs: (data words, the trainer, its config class).
TRL_RUNS = {"dpo": (DPO_DATA_WORDS, "trl.DPOTrainer", "trl.DPOConfig"),
            "kto": (KTO_DATA_WORDS, "trl.KTOTrainer", "trl.KTOConfig")}


def _install_heading(files: list[str], extras) -> list[str]:
    """"How to run"'s heading, the folder's files, and an open bash block that installs planner
    with the plan's extras."""
    return ["## How to run", "", "Files: " + ", ".join(f"`{f}`" for f in files) + ". `plan.json` is this plan as "
            "planner ranked it; no launch reads it.", "",
            "From this folder, after installing planner with the extras this plan needs (torch first, the build "
            "for your CUDA):", "", "```bash", install_line(extras)]


def how_to_run(draft: EmitDraft, files: list[str], seq_len: int, batching: Batching = Batching.PACKED,
               method: str = "sft") -> list[str]:
    """Commands that work from the plan folder after ``pip install llm-train-planner[...]``: the extras this
    plan needs, the real launch on the user's model and data, a smoke test named as one, and what a
    user's own script must apply (runtime.json beyond the libraries' defaults)."""
    applied = {k: v for k, v in draft.runtime.items() if k in RuntimeArgs.neutral() and v != RuntimeArgs.neutral()[k]}
    trl = TRL_RUNS.get(method)
    out = [
        *_install_heading(files, draft.extras),
        "MODEL=/path/to/your/model DATA=/path/to/train.jsonl ./launch.sh --max-steps 1000",
        "```",
        "",
        "`MODEL`: a local model folder (config, weights, tokenizer) or a Hugging Face id already in the local "
        "cache (nothing is downloaded). " + (trl[0].format(n=seq_len) if trl else
        "`DATA`: a JSONL file with a `text` field (`--text-field` names "
        "another), TRL's conversational `messages` (rendered with the model's chat template; only the assistants' "
        "turns train) or a `prompt` and `completion` (only the completion trains); a `.txt` file, or a folder "
        "written by `datasets`' `save_to_disk`; "
        f"{DATA_WORDS[batching].format(n=seq_len)}.") + " `python -m planner.launch --help` lists every option "
        "(output folder, steps, learning rate).",
        "",
        "Smoke test (checks the launch on your GPUs, not a training run): `DATA=sample` trains 20 steps on a "
        "small text shipped with planner:",
        "",
        "```bash",
        "MODEL=/path/to/your/model DATA=sample ./launch.sh --max-steps 20",
        "```",
        "",
        "The entry point runs " + (f"TRL's {trl[1].removeprefix('trl.')}" if trl else "the Hugging Face Trainer")
        + " with `training_args.json` under `accelerate launch` "
        f"with `accelerate_config.yaml`{' and `deepspeed_config.json`' if draft.deepspeed is not None else ''}, "
        f"applies `{RUNTIME_FILE}`, and at the end compares the live run (optimizer, dtypes, checkpointing, "
        "sharding, offload) with this plan.",
        "",
    ]
    if applied:
        out.append("Your own Trainer script instead (`TRAIN_SCRIPT=train.py ./launch.sh`) gets the standard files "
                   f"only; it must apply `{RUNTIME_FILE}` itself: "
                   + ", ".join(f"`{k}={v}`" for k, v in applied.items()) + ".")
    else:
        out.append("Your own Trainer script instead (`TRAIN_SCRIPT=train.py ./launch.sh`, reading `training_args.json` "
                   f"with `HfArgumentParser({trl[2] if trl else 'TrainingArguments'}).parse_json_file`"
                   f"{f', and training with {trl[1]}' if trl else ''}) runs this plan as it is: nothing in "
                   f"`{RUNTIME_FILE}` differs from the libraries' defaults but the sequence length ({seq_len:,}).")
    return out


def how_to_run_grpo(draft: EmitDraft, files: list[str], c) -> list[str]:
    """A GRPO plan's commands: the launch on the user's prompts with the user's reward function
    (``--reward``), a smoke test, the user's own TRL script instead; a server plan starts
    ``trl vllm-serve`` on its own GPUs first."""
    prompt = c.seq_len - c.completion_len
    out = [
        *_install_heading(files, draft.extras),
    ]
    if str(c.generation) == "vllm-server":
        out.append(f"CUDA_VISIBLE_DEVICES=<{c.vllm_gpus} other GPU(s)> trl vllm-serve --model $MODEL "
                   f"--tensor_parallel_size {c.vllm_tp} --data_parallel_size {max(1, c.vllm_gpus // c.vllm_tp)} &")
    out += [
        "MODEL=/path/to/your/model DATA=/path/to/prompts.jsonl ./launch.sh --reward my_rewards:accuracy "
        "--max-steps 1000",
        "```",
        "",
        f"`DATA`: a JSONL file whose lines hold a string `prompt` (the other fields reach the reward function), each "
        f"cut to {prompt:,} tokens (the plan's rows are {c.seq_len:,}: the prompt and {c.completion_len:,} "
        "generated). `--reward module:function`: your reward function, importable from the working directory, "
        "with TRL's signature. TRL's GRPOTrainer runs it with `training_args.json` (a GRPOConfig) and at the end "
        "the live run is compared with this plan (its generation, group, reference model too).",
        "",
        "Smoke test (checks the launch, not a training run): `DATA=sample` generates from prompts cut from a "
        "small text shipped with planner, rewarded by their length:",
        "",
        "```bash",
        "MODEL=/path/to/your/model DATA=sample ./launch.sh --max-steps 2",
        "```",
        "",
        "Your own TRL script instead (`TRAIN_SCRIPT=grpo.py ./launch.sh`) reads `training_args.json` with "
        "`HfArgumentParser(trl.GRPOConfig).parse_json_file` and trains with `trl.GRPOTrainer`.",
        "",
    ]
    return out
