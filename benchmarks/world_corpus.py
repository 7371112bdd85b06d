"""planner against published measurements of real runs: the world corpus (issue 36).

    python benchmarks/world_corpus.py            # print the per-case tables and the medians
    python benchmarks/world_corpus.py --write    # write docs/world.md (tests/test_world_corpus.py
                                                 # checks the committed page is this output)

The cases live in benchmarks/world/peaks.yaml (GPU memory peaks and the longest context that fit)
and benchmarks/world/throughputs.yaml, each with its provenance: the source, a verbatim quote,
the hardware and the configuration as the source states it, and a caveat. A case maps onto
planner's vocabulary (``request``); what the vocabulary cannot say is either assumed, and listed
with the case ("assumed: ..."), or the case is refused with the reason, never planned as
something else. Errors are (predicted - published) / published: negative means planner predicted
less memory (or more speed) than was published.

Which peak: a figure read by nvidia-smi (or of unknown origin) is held against the device-used peak
planner's verdicts use; ``torch.cuda.max_memory_reserved`` against the reserved peak;
``max_memory_allocated`` against the allocated peak (planner/core/ledger.py). Units: GiB
(``published_bytes``); a "GB" of unknown base is read as GiB, the reading that does not flatter
planner.
"""

import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from validation.page import page_command  # noqa: E402

from planner.strategies.sharding import DEEPSPEED_DEFAULTS, ZERO_KEYS  # noqa: E402

WORLD = ROOT / "benchmarks" / "world"
PAGE = ROOT / "docs" / "world.md"

#: A published GPU name -> planner's catalog id: (words that must all appear, lower case without
#: spaces or punctuation; the id; what is assumed). First match wins. An A100 or H100 whose variant
#: the source does not state is refused: 40 or 80 GB, SXM or PCIe, decide the answer.
GPUS = (
    (("a800",), "A100-80", "A800 as A100-80 (the same chip and memory; slower NVLink)"),
    (("a100", "pcie", "80"), "A100-PCIE-80", ""), (("a100", "pcie", "40"), "A100-PCIE-40", ""),
    (("a100", "80"), "A100-80", ""), (("a100", "40"), "A100-40", ""),
    (("h100", "96"), "", ""),  # a 96 GB H100 (Grand Teton): not in the catalog
    (("h100", "pcie"), "H100-PCIE-80", ""), (("h100", "80"), "H100-80", ""), (("h200",), "H200-141", ""),
    (("4090",), "RTX4090-24", ""), (("3090",), "RTX3090-24", ""), (("a10g",), "A10G-24", ""), (("l40s",), "L40S-48", ""),
    (("l4",), "L4-24", ""), (("t4",), "T4-16", ""), (("a6000",), "RTXA6000-48", ""), (("a40",), "A40-48", ""),
    (("24gb", "notstated"), "RTX4090-24", "a 24 GB card, model not stated (as RTX4090-24: memory decides)"),
    (("24gb", "notnamed"), "RTX4090-24", "a 24 GB card, model not stated (as RTX4090-24: memory decides)"),
    (("40gb", "notnamed"), "A100-40", "a 40 GB card, model not stated (as A100-40)"),
)
#: A published model name -> planner's catalog id and what is assumed (keys: lower case, letters and
#: digits only, of the name before any parenthesis).
MODELS = {
    "llama38b": ("meta-llama/Meta-Llama-3-8B", ""), "metallama38b": ("meta-llama/Meta-Llama-3-8B", ""),
    "metallama38binstruct": ("meta-llama/Meta-Llama-3-8B", "the Instruct model as its base (the same shapes)"),
    "llama318b": ("meta-llama/Llama-3.1-8B", ""), "llama3170b": ("meta-llama/Llama-3.1-70B", ""),
    "llama318binstruct": ("meta-llama/Llama-3.1-8B", "the Instruct model as its base (the same shapes)"),
    "llama323b": ("meta-llama/Llama-3.2-3B", ""), "llama3370binstruct": ("meta-llama/Llama-3.3-70B-Instruct", ""),
    "llama370b": ("meta-llama/Llama-3.1-70B", "Llama-3-70B as Llama-3.1-70B (the same shapes)"),
    "metallamametallama370b": ("meta-llama/Llama-3.1-70B", "Llama-3-70B as Llama-3.1-70B (the same shapes)"),
    "llama27b": ("meta-llama/Llama-2-7b-hf", ""), "llama27bhf": ("meta-llama/Llama-2-7b-hf", ""),
    "mistralaimixtral8x7binstructv01": ("mistralai/Mixtral-8x7B-v0.1", "the Instruct model as its base (the same shapes)"),
    "nousresearchllama270bhf": ("meta-llama/Llama-2-70b-hf", "NousResearch's re-upload of Llama-2-70b-hf (the same weights)"),
    "llama270b": ("meta-llama/Llama-2-70b-hf", ""),
    "llama7b": ("meta-llama/Llama-2-7b-hf", "LLaMA-7B as Llama-2-7B (the same shapes)"),
    "llama27barchitecture": ("meta-llama/Llama-2-7b-hf", ""), "llama270barchitecture": ("meta-llama/Llama-2-70b-hf", ""),
    "mistral7bv02base": ("mistralai/Mistral-7B-Instruct-v0.2", ""),
    "qwenqwen257binstruct": ("Qwen/Qwen2.5-7B", "the Instruct model as its base (the same shapes)"),
    "tinyllama11b": ("TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T", ""),
}
OPTIMIZERS = {
    "adamw": "adamw", "adamw_torch": "adamw-foreach", "torch.optim.adamw": "adamw-foreach", "adamw_torch_fused": "adamw",
    "adam": "adamw",
    "adamw-8bit": "adamw-8bit", "adamw_8bit": "adamw-8bit", "adamw_bnb_8bit": "adamw-8bit", "adamw8bit": "adamw-8bit",
    "paged-adamw-8bit": "paged-adamw-8bit", "paged_adamw_8bit": "paged-adamw-8bit",
    "paged-adamw": "paged-adamw", "paged_adamw_32bit": "paged-adamw", "paged-adamw-32bit": "paged-adamw",
    "sgd": "sgd", "adafactor": "adafactor", "lion": "lion",
}
SHARDING = {"none": ("none", None), "ddp": ("ddp", None), "zero1": ("zero1", None), "zero2": ("zero2", None),
            "zero3": ("zero3", None), "fsdp1": ("fsdp", 1), "fsdp2": ("fsdp", 2), "fsdp": ("fsdp", 2)}
METHODS = {"full": "none", "lora": "lora", "qlora": "qlora", "dora": "dora"}
#: What a named framework does where the source is silent: (words in ``framework``, the settings,
#: their source). Applied values are notes, not assumptions.
FRAMEWORK_DEFAULTS = (
    (("fsdp_qlora",), {"precision": "bf16-pure", "optimizer": "adamw_torch",
                       "lora": {"rank": 64, "alpha": 16, "targets": "all-linear"}},
     "fsdp_qlora train.py's argument defaults (precision bf16: parameters, gradients and states in bf16)"),
    (("llama-factory",), {"optimizer": "adamw_torch", "checkpointing": "full"},
     "LLaMA-Factory's defaults (the Trainer's adamw_torch; gradient checkpointing unless disabled)"),
    (("sfttrainer",), {"optimizer": "adamw_torch"}, "the Trainer's default optim (adamw_torch)"),
    (("hugging face transformers + fa2",), {"checkpointing": "full", "kbit_prep": "fp32-norms"},
     "Unsloth's Hugging Face baseline as TRL's SFTTrainer (<= 0.25) runs a 4-bit base under bf16 with gradient "
     "checkpointing (peft's prepare_model_for_kbit_training, the embeddings and head cast back to bf16)"),
    (("ms-swift",), {"optimizer": "adamw_torch"}, "the Trainer's default optim (adamw_torch), which ms-swift keeps"),
)


#: Frameworks that train their own model code, not transformers' (which planner's activations follow,
#: checked by its trace): their saved tensors may differ a little; said in the notes, still counted.
OWN_MODEL_CODE = (("litgpt", "LitGPT"), ("torchtune", "torchtune"))
#: Frameworks whose kernels are not transformers' eager code, the stack planner times (its rates are
#: that stack's: planner/catalog/data/efficiency.yaml ``stack``): their speed decides nothing about
#: planner's, so their throughput rows are shown, not counted (their peaks are counted).
OWN_KERNELS = (("nemo automodel", "NeMo AutoModel's (Triton LoRA, Liger, Transformer Engine)"),
               ("nemo container", "NeMo's (Megatron-core, Transformer Engine)"),
               ("llm-foundry", "llm-foundry's (fused layers)"), ("torchtitan", "torchtitan's"),
               ("litgpt", "LitGPT's"), ("torchtune", "torchtune's"))
SPEED_METRICS = ("tokens_per_s_per_gpu", "tokens_per_s_total", "samples_per_s", "step_seconds", "mfu")


@dataclass
class Mapped:
    """A case as planner's request (``fields``), what had to be assumed, or why it is refused."""

    fields: dict = field(default_factory=dict)
    assumed: list[str] = field(default_factory=list)
    refused: str = ""


def _key(name) -> str:
    return "".join(ch for ch in str(name).lower() if ch.isalnum()) if name else ""


def gpu_id(hw: dict) -> tuple[str | None, str]:
    """planner's catalog id for the published GPU, and what is assumed (None: not catalogued)."""
    key = _key(hw.get("gpu"))
    for words, gid, note in GPUS:
        if all(w in key for w in words):
            return gid or None, note
    return None, ""


def model_id(name) -> tuple[str | None, str]:
    """planner's catalog id for the published model, and what is assumed (None: not catalogued)."""
    from planner.catalog.models import resolve_model

    base = str(name or "").split(" (")[0].strip()  # (a trailing note in parentheses)
    try:
        return resolve_model(base).id, ""
    except Exception:  # noqa: BLE001 (not an id planner knows: the aliases below)
        pass
    # the whole name first: its parentheses may be part of it ("Llama 3.1 (8B) Instruct")
    return MODELS.get(_key(str(name or "")), MODELS.get(_key(base), (None, "")))


def request(case: dict) -> Mapped:
    """The case in planner's vocabulary (EstimateRequest fields)."""
    out = Mapped()
    for words, defaults, source in FRAMEWORK_DEFAULTS:
        if all(w in str(case.get("framework") or "").lower() for w in words):
            filled = [k for k in defaults if not case.get(k) or (isinstance(defaults[k], dict) and not any(
                (case.get(k) or {}).values()))]
            case = case | {k: defaults[k] for k in filled}
            out.assumed += [f"{', '.join(filled)} from {source}"] if filled else []
    own = next((name for word, name in OWN_MODEL_CODE if word in str(case.get("framework") or "").lower()), None)
    if own:
        out.assumed.append(f"{own}'s own model code, planned as transformers'")
    kernels = next((name for word, name in OWN_KERNELS if word in str(case.get("framework") or "").lower()), None)
    if kernels and case.get("metric") in SPEED_METRICS:
        out.assumed.append(f"kernels: {kernels} own, timed as transformers' eager code")
    if case.get("calibrates"):  # a figure a constant of planner's was fitted to: in-sample, shown only
        out.assumed.append(f"calibrates {case['calibrates']}: in-sample, not counted")
    if case.get("activation_offload") and case.get("checkpointing") != "full":
        out.refused = "activation offloading to host RAM without full checkpointing is not modelled"
        return out
    hw = case.get("hardware") or {}
    gid, note = gpu_id(hw)
    if gid is None:
        out.refused = f"GPU {hw.get('gpu')!r}: not in planner's catalog, or its variant is not stated"
        return out
    out.assumed += [note] if note else []
    total = hw.get("gpus_total")
    per_node, nodes = int(hw.get("gpus_per_node") or total or 1), int(hw.get("nodes") or 1)
    if total and not hw.get("gpus_per_node") and int(total) > 8:
        per_node, nodes = 8, int(total) // 8
        out.assumed.append(f"{total} GPUs as {nodes} nodes of 8")
    out.fields["gpus"] = f"{nodes}x{per_node}x{gid}" if nodes > 1 else f"{per_node}x{gid}"
    mid, note = model_id(case.get("model"))
    if mid is None:
        out.refused = f"model {case.get('model')!r} is not in planner's catalog"
        return out
    out.fields["model"] = mid
    out.assumed += [note] if note else []
    method = METHODS.get(str(case.get("method") or "full"))
    if method is None:
        out.refused = f"method {case.get('method')!r} is not planned"
        return out
    out.fields["adapter"] = method
    lora = case.get("lora") or {}
    if method != "none":
        for key in ("rank", "alpha"):
            if lora.get(key):
                out.fields[f"lora_{key}"] = int(lora[key])
            else:
                out.assumed.append(f"lora {key} {16 if key == 'rank' else 32} (TRL's default)")
        targets = str(lora.get("targets") or "")
        if not targets:
            out.assumed.append("lora targets all-linear")
        elif targets.replace("_", "-") in ("all-linear", "all"):
            out.fields["lora_targets"] = "all-linear"
        else:
            wanted = {t.strip().removesuffix("_proj") for t in targets.replace(";", ",").split(",") if t.strip()}
            if wanted == {"q", "v"}:
                out.fields["lora_targets"] = "qv"
            elif wanted == {"gate", "up", "down"}:
                out.fields["lora_targets"] = "mlp"
            elif wanted <= {"q", "k", "v", "o"}:
                out.fields["lora_targets"] = "attention"
                if wanted != {"q", "k", "v", "o"}:
                    # each wrapped matmul with its own input copy (dropout, or fp32 adapters' cast) holds
                    # it per token: then wrapping more than the source did decides the figure
                    copies = float(lora.get("dropout") or 0) > 0 or case.get("adapter_dtype") == "fp32"
                    said = f"lora targets {targets} as attention (q, k, v, o)"
                    out.assumed.append(f"lora targets widened: {said}; each wrapped matmul keeps its own input copy"
                                       if copies else said)
            elif wanted >= {"q", "k", "v", "o", "gate", "up", "down"}:
                out.fields["lora_targets"] = "all-linear"
            else:
                out.refused = f"lora targets {targets} are none of all-linear, attention, qv and mlp"
                return out
        if lora.get("dropout") is not None:
            out.fields["lora_dropout"] = float(lora["dropout"])
    precision = case.get("precision")
    if precision:
        out.fields["precision"] = {"fp8": "fp8-mixed", "fp16-pure": "bf16-pure"}.get(str(precision), str(precision))
        if precision == "fp16-pure":  # (no fp16-pure in planner's vocabulary: the same bytes and matmul rate)
            out.assumed.append("precision fp16-pure as bf16-pure (the same bytes and matmul rate)")
    else:
        out.fields["precision"] = "bf16-mixed"
        out.assumed.append("precision bf16-mixed")
    optimizer = case.get("optimizer")
    if optimizer:
        mapped = OPTIMIZERS.get(str(optimizer).split(" (")[0].lower())
        if mapped is None:
            out.refused = f"optimizer {optimizer!r} is not in planner's vocabulary"
            return out
        out.fields["optimizer"] = mapped
        if mapped == "adamw-foreach" and str(case.get("sharding")).startswith("zero") and str(
                case.get("offload") or "none").startswith("optimizer"):
            out.fields["optimizer"] = "adamw"  # accelerate hands DeepSpeed's CPU Adam the offloaded step
            out.assumed.append("torch's AdamW as DeepSpeed's CPU Adam under offload (accelerate's "
                               "map_pytorch_optim_to_deepspeed)")
    else:
        out.assumed.append("optimizer adamw")
    sharding = str(case.get("sharding") or "")
    if sharding:
        if sharding not in SHARDING:
            out.refused = f"sharding {sharding!r} is not planned"
            return out
        mode, version = SHARDING[sharding]
        out.fields["sharding"] = mode
        if version:
            out.fields["fsdp_version"] = version
        if case.get("deepspeed_buckets") == "defaults":  # accelerate's inline plugin: DeepSpeed's own defaults
            out.fields |= {name: DEEPSPEED_DEFAULTS[key] for key, name in ZERO_KEYS.items()}
    elif per_node * nodes > 1:
        out.fields["sharding"] = "ddp"
        out.assumed.append("ddp (several GPUs, no engine named)")
    if case.get("offload"):
        out.fields["offload"] = str(case["offload"])
    ckpt = case.get("checkpointing")
    if ckpt in ("full", "none", "selective"):
        out.fields["checkpointing"] = ckpt
        if case.get("activation_offload"):  # under full checkpointing what is saved is each layer's input
            out.fields["checkpoint_offload"] = "host"
            out.assumed.append("activation offloading under full checkpointing as checkpoint offload (the layers' "
                               "inputs in host RAM)")
    elif ckpt == "unsloth":  # Unsloth's offloaded checkpointer: each layer's input to host RAM until its backward
        out.fields |= {"checkpointing": "full", "checkpoint_offload": "host"}
        out.assumed.append("unsloth checkpointing as full with each layer's input in host RAM (checkpoint offload host)")
    else:
        out.assumed.append("checkpointing none")
    attention = case.get("attention")
    if attention == "eager":
        out.fields["attention"] = "eager"
    elif attention is None:
        out.assumed.append("attention sdpa (fused)")
    if str(case.get("loss_kernel") or "").split(" (")[0] in ("liger", "unsloth", "cut_cross_entropy", "chunked_ce"):
        out.fields["loss"] = "chunked"
    # what the source's libraries ran (each with its *_source)
    for key in ("loss_path", "model_output", "adapter_dtype", "nf4_matmul", "checkpoint_impl", "kbit_prep"):
        if case.get(key):
            out.fields[key] = str(case[key])
    if out.fields.get("adapter_dtype") == "fp32" and out.fields.get("adapter") != "lora":
        del out.fields["adapter_dtype"]
        out.assumed.append(f"adapter dtype fp32 planned as auto (16 bit): {out.fields.get('adapter')}'s fp32 casts "
                           "are not modelled")
    for key in ("micro_batch_size", "grad_accum"):
        if case.get(key):
            out.fields[key] = int(case[key])
        elif key == "micro_batch_size":
            out.fields[key] = 1
            out.assumed.append("micro-batch 1")
    if case.get("seq_len"):
        out.fields["seq_len"] = int(case["seq_len"])
    elif case.get("metric") != "max_seq_len_fit":
        out.refused = "no sequence length stated"
        return out
    if case.get("packing") is False:
        out.assumed.append("every sequence at the full length (padding or not, the peak's batch)")
    return out


def published_bytes(case: dict) -> int:
    """The published peak in bytes. ``peak_gib`` is GiB where the collector converted the stated
    figure (raw bytes, or decimal GB the source's own code computes: ``peak_as_stated`` differs);
    else it is the figure as stated: MiB and GiB binary, and "GB" or "G" of unknown base read as
    GiB too, the reading that does not flatter planner (a larger published peak)."""
    value = float(case["peak_gib"])
    if str(case.get("unit_as_stated")) == "MiB" and str(case.get("peak_as_stated")) == str(case.get("peak_gib")):
        return int(value * 2**20)
    return int(value * 2**30)


def predicted_bytes(plan, reading: str | None) -> int:
    if reading == "max_memory_allocated":
        return plan.allocated_peak_bytes
    if reading == "max_memory_reserved":
        return plan.reserved_peak_bytes
    return plan.memory["peak"]


#: A published peak below ``model_states_bytes``: the figure cannot be the stated configuration's.
BELOW = "published below"


def model_states_bytes(plan) -> int:
    """Bytes per GPU of the weights, gradients and dense optimizer states the plan holds on the
    GPU (parameter counts times element bytes, before any activation): every real run of the
    configuration holds at least these at its step, whatever its framework: the largest sum of
    those alive in one phase."""
    rows = [r for r in plan.ledger if r.location == "gpu" and r.term in ("weights", "gradients", "optimizer_states")]
    return max((sum(r.bytes for r in rows if phase in r.phases) for phase in {p for r in rows for p in r.phases}), default=0)


def estimate_case(fields: dict):
    from planner.engine.estimate import estimate
    from planner.schema.estimate import EstimateRequest

    plan = estimate(EstimateRequest(**fields))
    if not plan.feasible:  # planner refuses the configuration: no prediction to compare
        raise ValueError("; ".join(plan.reasons))
    return plan


def longest_fitting(fields: dict, ceiling: int = 262_144) -> int:
    """The longest sequence (multiple of 256) whose plan fits, by bisection: memory grows with it."""
    lo, hi = 0, ceiling // 256
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if estimate_case(fields | {"seq_len": mid * 256}).fits:
            lo = mid
        else:
            hi = mid - 1
    return lo * 256


#: Assumptions that can decide a peak or a speed: a row that needs one is shown, but kept out of the
#: headline figures ("stated" rows only).
CORE = ("precision ", "optimizer ", "checkpointing ", "micro-batch ", "ddp (", "gpu form factor ", "lora targets widened",
        "adapter dtype ", "kernels: ", "calibrates ")
#: Catalog GPUs whose form factor decides a speed but not a memory (SXM and PCIe: the same memory,
#: a lower power limit and bandwidth on PCIe), and the words that state it.
FORM_FACTORS = (("A100-80", "A100-40", "H100-80"), ("sxm", "pcie", "dgx", "hgx"))


def form_factor_note(case: dict, gid: str) -> str:
    """For a throughput: the assumption when an SXM-or-PCIe GPU's form factor is not stated."""
    if gid in FORM_FACTORS[0] and not any(w in _key((case.get("hardware") or {}).get("gpu")) for w in FORM_FACTORS[1]):
        return "gpu form factor not stated (as SXM: a PCIe card's lower power limit runs slower)"
    return ""


@dataclass
class Row:
    id: str
    config: str
    published: str
    predicted: str
    error: float | None
    notes: str

    @property
    def stated(self) -> bool:
        """The source states every setting that decides the figure (no ``CORE`` assumption)."""
        return self.error is not None and not any(n.strip().startswith((*CORE, BELOW)) for n in self.notes.split(";"))


def _config_words(f: dict) -> str:
    """'1xRTX4090-24, qlora, bf16-mixed, paged-adamw-8bit, ckpt full, mbs 1, seq 2048'."""
    words = {"adapter": lambda v: "full fine-tuning" if v == "none" else v, "sharding": str, "offload": lambda v: f"offload {v}",
             "checkpointing": lambda v: f"ckpt {v}", "micro_batch_size": lambda v: f"mbs {v}",
             "grad_accum": lambda v: f"accum {v}", "seq_len": lambda v: f"seq {v}"}
    keys = ("gpus", "adapter", "precision", "optimizer", "sharding", "offload", "checkpointing", "micro_batch_size",
            "grad_accum", "seq_len")
    return ", ".join(words.get(k, str)(f[k]) for k in keys if k in f)


def peak_rows(cases: list[dict]) -> list[Row]:
    rows = []
    for case in cases:
        if case.get("metric") == OUT_OF_MEMORY:
            continue
        m = request(case)
        notes = "; ".join(m.assumed)
        if m.refused:
            rows.append(Row(case["id"], "", "", "", None, f"refused: {m.refused}"))
            continue
        if case.get("metric") == "max_seq_len_fit":
            published = int(case.get("value") or case.get("seq_len") or 0)
            fields = {k: v for k, v in m.fields.items() if k != "seq_len"}
            try:
                got = longest_fitting(fields)
            except ValueError as e:
                rows.append(Row(case["id"], _config_words(m.fields), "", "", None, f"refused by planner: {str(e)[:120]}"))
                continue
            rows.append(Row(case["id"], _config_words(m.fields), f"{published:,} tokens", f"{got:,} tokens",
                            got / published - 1 if published else None, notes))
            continue
        try:
            plan = estimate_case(m.fields)
        except Exception as e:  # noqa: BLE001 (planner's own refusal: shown as the case's result)
            rows.append(Row(case["id"], _config_words(m.fields), "", "", None, f"refused by planner: {str(e)[:120]}"))
            continue
        pub, pred = published_bytes(case), predicted_bytes(plan, case.get("reading"))
        floor = model_states_bytes(plan)
        if pub < floor and not any(a.startswith(CORE) for a in m.assumed):
            notes = "; ".join([f"{BELOW} the stated configuration's weights, gradients and optimizer states alone "
                               f"({floor / 2**30:.1f} GiB): not this configuration's run", *m.assumed])
        rows.append(Row(case["id"], _config_words(m.fields), f"{pub / 2**30:.1f} GiB ({case.get('reading') or 'unknown'})",
                        f"{pred / 2**30:.1f}", pred / pub - 1, notes))
    return rows


def throughput_rows(cases: list[dict]) -> list[Row]:
    rows = []
    for case in cases:
        m = request(case)
        if m.refused:
            rows.append(Row(case["id"], "", "", "", None, f"refused: {m.refused}"))
            continue
        try:
            plan = estimate_case(m.fields)
        except Exception as e:  # noqa: BLE001
            rows.append(Row(case["id"], _config_words(m.fields), "", "", None, f"refused by planner: {str(e)[:120]}"))
            continue
        metric, value = case.get("metric"), float(case["value"])
        gpus = plan.hardware.num_gpus
        seq = plan.config.seq_len
        per_gpu = {
            "tokens_per_s_per_gpu": value,
            "tokens_per_s_total": value / gpus,
            "samples_per_s": value * seq / gpus,
            "step_seconds": plan.time.tokens_per_second / gpus * plan.time.step_seconds / value if value else None,
        }.get(metric)
        if metric == "mfu":
            rows.append(Row(case["id"], _config_words(m.fields), f"MFU {value:.1%}", f"MFU {plan.time.mfu:.1%}",
                            plan.time.mfu / value - 1, "; ".join(m.assumed)))
            continue
        if per_gpu is None:
            rows.append(Row(case["id"], _config_words(m.fields), "", "", None, f"refused: metric {metric!r}"))
            continue
        pred = plan.time.tokens_per_second_per_gpu
        form = form_factor_note(case, str(m.fields["gpus"]).split("x")[-1])
        rows.append(Row(case["id"], _config_words(m.fields), f"{per_gpu:,.0f} tok/s/GPU", f"{pred:,.0f}",
                        pred / per_gpu - 1, "; ".join([*m.assumed, *([form] if form else [])])))
    return rows


#: A published run that failed for want of GPU memory (its ``caveat`` says how the source shows it).
OUT_OF_MEMORY = "out_of_memory"


def verdict_rows(cases: list[dict]) -> list[tuple[str, str, str, str, str]]:
    """(case, published, planner's GPU verdict with its default margin, agree, agree with no
    margin) for every run whose outcome the source shows: the out-of-memory failures, and every
    peak case with its deciding settings stated (the run completed). A plan agrees when it fits
    the GPU exactly where the run completed (host RAM, which sources rarely state, is not judged):
    a completed run said not to fit is a false alarm, an out-of-memory run said to fit a broken
    promise."""
    out = []
    for case in cases:
        m = request(case)
        if m.refused:
            continue
        ran = case.get("metric") != OUT_OF_MEMORY
        if ran and (case.get("metric") != "peak_memory" or any(a.startswith(CORE) for a in m.assumed)):
            continue
        try:
            plan, bare = estimate_case(m.fields), estimate_case(m.fields | {"margin": 0.0})
        except Exception:  # noqa: BLE001 (planner's own refusal: no verdict)
            continue
        fits, fits_bare = plan.headroom_bytes >= 0, bare.headroom_bytes >= 0
        said = f"{'fits' if fits else 'does not fit'} ({plan.memory['peak'] / 2**30:.1f} of {plan.usable_bytes / 2**30:.1f} GiB)"
        out.append((case["id"], "ran" if ran else "out of memory", said, "yes" if fits == ran else "NO",
                    "yes" if fits_bare == ran else "NO"))
    return out


def verdict_lines(rows: list[tuple[str, str, str, str, str]]) -> list[str]:
    if not rows:
        return []
    ooms = [r for r in rows if r[1] == "out of memory"]
    ran = len(rows) - len(ooms)

    def said(col: int) -> str:
        agree = sum(r[col] == "yes" for r in rows)
        caught = sum(r[col] == "yes" for r in ooms)
        return (f"{agree} of {len(rows)} agree: {caught} of {len(ooms)} out-of-memory runs said not to fit, "
                f"{agree - caught} of {ran} completed runs said to fit")
    lines = [f"- with the default 3 % margin: {said(3)}", f"- with no margin: {said(4)}", "",
             "| case | published | planner (3 % margin) | agree | agree with no margin |", "|---|---|---|---|---|"]
    return lines + [f"| {' | '.join(r)} |" for r in rows]


def summary(rows: list[Row], what: str) -> list[str]:
    """The headline over the rows whose source states every deciding setting, then the count of
    those that needed a core assumption and of those refused."""
    errors = [r.error for r in rows if r.stated and r.error is not None]
    assumed = sum(r.error is not None and not r.stated for r in rows)
    refused = sum(r.error is None for r in rows)
    tail = f"; {assumed} more need an assumption that can decide the figure (shown, not counted), {refused} refused"
    if not errors:
        return [f"- {what}: no case with every deciding setting stated{tail}"]
    return [f"- {what}: {len(errors)} cases with every deciding setting stated: median |error| "
            f"{statistics.median(abs(e) for e in errors):.1%}, most under-predicted {min(errors):+.1%}, "
            f"most over-predicted {max(errors):+.1%}; within 5 %: {sum(abs(e) <= 0.05 for e in errors)}, "
            f"within 15 %: {sum(abs(e) <= 0.15 for e in errors)}{tail}"]


def table(rows: list[Row], heads: tuple[str, ...]) -> list[str]:
    out = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for r in rows:
        err = "" if r.error is None else f"{r.error:+.1%}" if r.stated else f"({r.error:+.1%})"
        out.append(f"| {r.id} | {r.config} | {r.published} | {r.predicted} | {err} | {r.notes} |")
    return out


def provenance(cases: list[dict]) -> list[str]:
    out = ["| case | source | quote | caveat |", "|---|---|---|---|"]
    for c in cases:
        quote = " ".join(str(c.get("quote", "")).split()).replace("|", "/")
        caveat = " ".join(str(c.get("caveat") or "").split()).replace("|", "/")
        out.append(f"| {c['id']} | {c.get('source', '')} | \"{quote}\" | {caveat} |")
    return out


def quantile(xs: list[float], p: float) -> float:
    """The p-quantile of ``xs``, interpolated linearly between order statistics."""
    xs = sorted(xs)
    k = (len(xs) - 1) * p
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def allocator_lines(records: list[dict]) -> list[str]:
    """What PyTorch's out-of-memory messages in public training threads say of the caching
    allocator: memory reserved but unallocated at the failure, over the memory allocated, for the
    default allocator and for expandable segments (CI tests of tiny models left out)."""
    out = ["| allocator | messages | 25 % | median | 75 % | 90 % | at most 3 % |", "|---|---|---|---|---|---|---|"]
    for group in ("default", "expandable"):
        xs = [r["computed"]["fraction_unallocated_over_allocated"] for r in records
              if r.get("group") == group and r.get("category") != "ci_test"]
        if xs:
            cells = " | ".join(f"{quantile(xs, p):.1%}" for p in (0.25, 0.5, 0.75, 0.9))
            out.append(f"| {group} | {len(xs)} | {cells} | {sum(x <= 0.03 for x in xs)} |")
    return out


#: Margins the page weighs against the world's peaks (planner's default is 3 %).
MARGINS = (0.0, 0.03, 0.05, 0.10, 0.15, 0.20, 0.25)


def margin_lines(rows: list[Row]) -> list[str]:
    """For each margin m, the counted peaks a plan predicted to fill (1 - m) of the GPU would hold:
    a run at the published peak fits when published <= predicted / (1 - m), i.e. when planner's
    error is at least -m."""
    errors = [r.error for r in rows if r.stated and r.error is not None]
    if not errors:
        return []
    cells = " | ".join(f"{sum(e >= -m for e in errors)} of {len(errors)}" for m in MARGINS)
    return ["| margin | " + " | ".join(f"{m:.0%}" for m in MARGINS) + " |", "|---|" + "---|" * len(MARGINS),
            f"| peaks within it | {cells} |"]


def load(name: str) -> list[dict]:
    path = WORLD / name
    return (yaml.safe_load(path.read_text()) or []) if path.exists() else []


def page() -> str:
    peaks, speeds = load("peaks.yaml"), load("throughputs.yaml")
    p_rows, t_rows = peak_rows(peaks), throughput_rows(speeds)
    lines = ["# planner against published measurements", "",
             "Generated by `python benchmarks/world_corpus.py --write` from `benchmarks/world/`: do not edit.",
             "Each case is a figure a public source measured on a real run, with its configuration as the source",
             "states it (the provenance table below quotes it). Errors are (predicted - published) / published;",
             "negative means planner predicted less memory, or more speed, than was measured. The notes list what",
             "the source did not say and planner filled in; an error in parentheses rests on such an assumption",
             "that can decide it (precision, optimizer, checkpointing, micro-batch, engine) and is left out of the",
             "summary. Refused cases name what planner's vocabulary or catalog cannot say.", "", "## Summary", ""]
    lines += summary([r for r in p_rows if "tokens" not in r.published], "GPU memory peak")
    lines += summary([r for r in p_rows if "tokens" in r.published], "longest context that fits")
    lines += summary(t_rows, "throughput")
    lines += ["", "## GPU memory peaks and longest contexts", ""]
    lines += table(p_rows, ("case", "plan", "published", "planner", "error", "notes"))
    lines += ["", "## Throughput", ""]
    lines += table(t_rows, ("case", "plan", "published", "planner", "error", "notes"))
    lines += ["", "## The margin the world asks for", "",
              "A plan predicted to fill the GPU less the margin holds a run whose real peak is at most the",
              "prediction over (1 - margin): every counted peak above whose error is no lower than minus the margin.", ""]
    lines += margin_lines([r for r in p_rows if "tokens" not in r.published])
    lines += ["", "## Fits or runs out of memory", "",
              "Runs whose source shows how they ended: out of memory, or completed (the peaks above whose",
              "deciding settings are stated). planner's GPU verdict, with its default 3 % margin kept free and",
              "with none: a completed run said not to fit is a false alarm, an out-of-memory run said to fit a",
              "broken promise.", ""]
    lines += verdict_lines(verdict_rows(peaks))
    lines += ["", "## The caching allocator at out-of-memory errors", "",
              "PyTorch's out-of-memory message gives the memory the caching allocator holds reserved but",
              "unallocated when it fails (after it has released its free segments and retried), beside what is",
              "allocated: the fragmentation a run meets at its limit. From public training threads",
              "(`benchmarks/world/oom_fragmentation.yaml`, each message quoted with its thread), as a fraction",
              "of the allocated memory. planner keeps 0.5 % plus its techniques' own pools, and a 3 % margin.", ""]
    lines += allocator_lines(load("oom_fragmentation.yaml"))
    lines += ["", "## Provenance", ""] + provenance(peaks + speeds)
    return "\n".join(lines) + "\n"


def main() -> int:
    return page_command(__doc__ or "", page, PAGE, ROOT)


if __name__ == "__main__":
    sys.exit(main())
