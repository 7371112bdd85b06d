"""LLaMA-Factory and axolotl training YAMLs, read as the Trainer/TRL recipe each one becomes.

Both frameworks build transformers' Trainer from their own keys; ``translate`` rewrites a file into
the keys planner's readers know (TrainingArguments and TRL's ModelConfig: ``use_peft``,
``lora_r``, ``load_in_4bit``, ``max_length``, ``attn_implementation``, ``torch_dtype``), with the
framework's defaults written out, and remembers which of the file's keys (or which default) each
one came from, so every value still names its source. Facts, at the commits the corpus holds
(LF: hiyouga/LLaMA-Factory@ff6d4d12; AX: axolotl-ai-cloud/axolotl@067b021c):

LLaMA-Factory (``llamafactory-cli train``): HfArgumentParser refuses unknown keys
(hparams/parser.py ``_parse_args``, unless ALLOW_EXTRA_ARGS); ``finetuning_type`` defaults to lora
(finetuning_args.py), ``lora_rank`` 8, ``lora_alpha`` None -> 2 x rank, ``lora_dropout`` 0,
``lora_target`` "all" = every linear but the head (model_utils/misc.py); ``quantization_bit`` 4
with the bnb method over LoRA is QLoRA, 8 LoRA over an LLM.int8() base (model_utils/quantization.py),
``additional_target`` modules are trained in full (peft ``modules_to_save``); gradient checkpointing is on
unless ``disable_gradient_checkpointing`` (model_utils/checkpointing.py); ``cutoff_len`` 2048
(data_args.py), ``packing`` off but in pre-training (``stage: pt``), and ``neat_packing`` packs too;
``flash_attn`` auto leaves transformers' default, disabled/sdpa/fa2/fa3 set
eager/sdpa/flash_attention_2/3 (model_utils/attention.py); trainable parameters are upcast to
fp32 unless ``pure_bf16`` (model/adapter.py), so bf16 trains fp32 weights with autocast;
checkpointing is reentrant unless ``use_reentrant_gc`` false (hparams/model_args.py; FSDP2 sets it
false: model_utils/checkpointing.py).

axolotl: pydantic drops unknown keys silently (utils/schemas/config.py: no ``extra``), so they
warn here; ``bf16`` defaults to "auto" (bf16 where the GPU has it) and the model loads in that
dtype, with no fp32 upcast (utils/config/__init__.py ``resolve_dtype``, loaders/model.py);
``adapter`` lora / qlora (qlora requires ``load_in_4bit``; lora with ``load_in_8bit`` is LoRA over an
LLM.int8() base; ``lora_modules_to_save`` are trained in full), ``lora_r`` and ``lora_alpha`` have no
default, ``lora_dropout`` 0, ``lora_target_linear`` = every linear but the head (utils/schemas/
peft.py, loaders/adapter.py); ``sequence_len`` 512, ``sample_packing`` off (one sample per row,
padded to the batch's longest, or to ``sequence_len`` with ``pad_to_sequence_len``), ``micro_batch_size`` and
``gradient_accumulation_steps`` 1, ``optimizer`` adamw_torch_fused, ``gradient_checkpointing``
off (utils/schemas/training.py, config.py), reentrant when on unless
``gradient_checkpointing_kwargs``, ``rl`` or ``unfrozen_parameters`` is set (utils/config/__init__.py
``normalize_config``); the legacy attention booleans map to ``attn_implementation`` (config.py);
``fsdp_config`` keys lose their ``fsdp_`` prefix and a config without a version is FSDP1
(utils/schemas/validation.py); under FSDP2 axolotl's own
``fsdp2_prepare_model`` keeps bf16 parameters (monkeypatch/accelerate/fsdp2.py). ``rl: dpo`` and
``rl: ipo`` train with TRL's DPOTrainer (core/trainers/dpo/trainer.py: ``AxolotlDPOTrainer``
overrides no loss), its DPOConfig built from ``sequence_len`` (``max_length``),
``precompute_ref_log_probs`` and ``dpo_*`` keys (core/trainers/dpo/__init__.py), an adapter's
disabled base as the reference (the peft config passed to the trainer: core/builders/rl.py).
``rl: kto`` trains with TRL's KTOTrainer (core/trainers/trl.py: ``AxolotlKTOTrainer``, mixins
only), its KTOConfig built from ``sequence_len`` (``max_length``), ``rl_beta`` and the
``kto_*_weight`` keys (core/builders/rl.py: no ``precompute_ref_log_probs``, KTOConfig's loss).
``rl: grpo`` trains with TRL's GRPOTrainer (core/trainers/grpo/trainer.py: ``AxolotlGRPOTrainer``
adds mixins for the optimizer, scheduler and RNG, no generation or loss of its own), its GRPOConfig
built from the ``trl:`` and ``vllm:`` blocks (``_axolotl_grpo``).
"""

from planner.check.methods import AXOLOTL_DPO, framework_method
from planner.check.recipe_keys import recipe_keys, suggestion
from planner.strategies.method import GRPO_DEFAULTS

LLAMAFACTORY, AXOLOTL = "llamafactory", "axolotl"
NAMES = {LLAMAFACTORY: "LLaMA-Factory", AXOLOTL: "axolotl"}
#: Keys only a LLaMA-Factory / an axolotl file has (transformers, TRL and the other has none).
MARKERS = {LLAMAFACTORY: ("finetuning_type", "stage", "cutoff_len", "template", "lora_target", "quantization_bit"),
           AXOLOTL: ("base_model", "sequence_len", "micro_batch_size", "lora_target_linear", "adapter")}
LF_ATTENTION = {"disabled": "eager", "sdpa": "sdpa", "fa2": "flash_attention_2", "fa3": "flash_attention_3"}
AX_ATTENTION = {"flash_attention": "flash_attention_2", "sdp_attention": "sdpa", "eager_attention": "eager",
                "xformers_attention": "xformers", "flex_attention": "flex_attention", "sage_attention": "sage"}
#: TrainingArguments keys both frameworks pass through unchanged.
PASSED = ("per_device_train_batch_size", "gradient_accumulation_steps", "bf16", "fp16", "optim", "deepspeed", "fsdp",
          "fsdp_config", "torch_compile", "gradient_checkpointing", "use_liger_kernel", "eval_strategy",
          "evaluation_strategy", "per_device_eval_batch_size")


def detect(d: dict) -> str | None:
    """The framework whose file ``d`` is (None: a Trainer/TRL recipe)."""
    for framework, markers in MARKERS.items():
        if any(k in d for k in markers):
            return framework
    return None


class Translation:
    """The Trainer/TRL keys a framework file becomes, each with the file key (or default) it came
    from, and what the file gets wrong (problems) or the planner does not model (warnings)."""

    def __init__(self, framework: str, d: dict, where: str):
        self.framework, self.d, self.where = framework, d, where
        self.args: dict = {k: d[k] for k in PASSED if k in d}
        self.origins: dict[str, str] = {}
        self.problems: list[str] = []
        self.warnings: list[str] = []
        self.model: tuple[str, str] | None = None

    def put(self, key: str, value, origin: str) -> None:
        self.args[key], self.origins[key] = value, origin

    def default(self, key: str, file_key: str, value) -> None:
        """``key`` from ``file_key``, or the framework's default when the file does not say."""
        if file_key in self.d:
            self.put(key, self.d[file_key], file_key)
        else:
            self.put(key, value, f"no {file_key} ({NAMES[self.framework]}'s default, {value})")

    def name_model(self, key: str) -> None:
        if isinstance(self.d.get(key), str):
            self.model = (self.d[key], f"{self.where}: {key}")


#: File keys that split a sequence or a layer over GPUs, per framework, with what realises them:
#: none is the Ulysses planner models (DeepSpeed's, through accelerate), so a degree above 1 is
#: refused rather than planned as data parallelism (axolotl: utils/schemas/config.py and
#: ring-flash-attn; 360-LLaMA-Factory, Qihoo360/360-LLaMA-Factory: ``sequence_parallel_size``
#: with its own zigzag-ring or Ulysses attention).
DEGREE_KEYS = {
    AXOLOTL: {"context_parallel_size": "axolotl's ring-attention context parallelism (ring-flash-attn)",
              "sequence_parallel_degree": "axolotl's ring-attention sequence parallelism (ring-flash-attn)",
              "tensor_parallel_size": "axolotl's tensor parallelism"},
    LLAMAFACTORY: {"sequence_parallel_size": "360-LLaMA-Factory's sequence parallelism (its own ring or Ulysses "
                                             "attention, not DeepSpeed's)"},
}


def translate(framework: str, d: dict, where: str) -> Translation:
    t = Translation(framework, d, where)
    (_llamafactory if framework == LLAMAFACTORY else _axolotl)(t)
    for key, what in DEGREE_KEYS[framework].items():
        value = d.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            t.problems.append(f"{where}: {key} {value}: {what} is not modelled yet, so planner cannot give this job "
                              "a verdict (it would be planned as data parallelism over every GPU, which it is not)")
    refusal = framework_method(framework == LLAMAFACTORY, d, where)
    if refusal:
        t.problems.append(refusal)
    return t


def _llamafactory(t: Translation) -> None:
    d, where = t.d, t.where
    t.name_model("model_name_or_path")
    kind = d.get("finetuning_type", "lora")
    if kind not in ("lora", "full"):
        t.problems.append(f"{where}: finetuning_type {kind!r} is not planned (planner plans full and lora)")
    bits, method = d.get("quantization_bit"), str(d.get("quantization_method", "bnb"))
    if bits is not None and (bits not in (4, 8) or method != "bnb"):
        t.problems.append(f"{where}: quantization_bit {bits} with quantization_method {method} is not planned "
                          "(planner plans bitsandbytes under LoRA: quantization_bit 4 (NF4) or 8 (LLM.int8()), "
                          "method bnb)")
    if kind == "lora":
        t.put("use_peft", True, "finetuning_type lora" if "finetuning_type" in d else
              "no finetuning_type (LLaMA-Factory's default, lora)")
        if bits in (4, 8):
            t.put(f"load_in_{bits}bit", True, f"quantization_bit {bits}")
        if d.get("additional_target"):
            t.put("lora_modules_to_save", d["additional_target"], "additional_target")
        t.default("lora_r", "lora_rank", 8)
        rank = t.args["lora_r"]
        if d.get("lora_alpha") is not None:
            t.put("lora_alpha", d["lora_alpha"], "lora_alpha")
        elif isinstance(rank, int) and not isinstance(rank, bool):
            t.put("lora_alpha", 2 * rank, f"no lora_alpha (LLaMA-Factory's default, 2 x lora_rank = {2 * rank})")
        t.default("lora_dropout", "lora_dropout", 0.0)
        target = d.get("lora_target", "all")
        modules = "all-linear" if target == "all" else [s.strip() for s in str(target).split(",") if s.strip()]
        t.put("lora_target_modules", modules, "lora_target" if "lora_target" in d else
              "no lora_target (LLaMA-Factory's default, all)")
        if d.get("use_dora"):
            t.put("use_dora", True, "use_dora")
        if d.get("upcast_layernorm") is True:
            t.put("upcast_layernorm", True, "upcast_layernorm")
    if "gradient_checkpointing" not in d:
        off = d.get("disable_gradient_checkpointing", False) is True
        t.put("gradient_checkpointing", not off, "disable_gradient_checkpointing" if "disable_gradient_checkpointing"
              in d else "no disable_gradient_checkpointing (LLaMA-Factory's default: checkpointing on)")
        if not off and "gradient_checkpointing_kwargs" not in d:
            reentrant = d.get("use_reentrant_gc", True)
            t.put("gradient_checkpointing_kwargs", {"use_reentrant": reentrant}, "use_reentrant_gc" if "use_reentrant_gc"
                  in d else "no use_reentrant_gc (LLaMA-Factory's default; FSDP2 sets it false)")
    t.default("max_length", "cutoff_len", 2048)
    if d.get("stage") == "dpo":  # read by strategies/method.py: LLaMA-Factory's own DPO trainer
        t.put("stage", "dpo", "stage")
        t.default("pref_loss", "pref_loss", "sigmoid")
    packed = (d["packing"] if d.get("packing") is not None else d.get("stage") == "pt") is True \
        or d.get("neat_packing") is True
    t.put("packing", packed, next((k for k in ("neat_packing", "packing") if d.get(k) is not None), None)
          or f"no packing (LLaMA-Factory's default: {'on in pre-training' if packed else 'off'})")
    attention = d.get("flash_attn", "auto")
    if isinstance(attention, str) and attention in LF_ATTENTION:
        t.put("attn_implementation", LF_ATTENTION[attention], f"flash_attn {attention}")
    elif attention != "auto":
        t.problems.append(f"{where}: flash_attn {attention!r}: one of auto, {', '.join(LF_ATTENTION)} "
                          "(llamafactory-cli refuses other values)")
    if d.get("enable_liger_kernel"):
        t.put("use_liger_kernel", True, "enable_liger_kernel")
    if d.get("pure_bf16"):
        t.put("torch_dtype", "bfloat16", "pure_bf16 (no fp32 upcast)")
    for key in ("use_unsloth", "use_unsloth_gc", "use_badam", "use_galore", "use_apollo"):
        if d.get(key):
            t.warnings.append(f"{where}: {key} is not modelled; its memory and speed are not counted")


def _axolotl(t: Translation) -> None:
    d, where = t.d, t.where
    t.name_model("base_model")
    adapter, four, eight = d.get("adapter"), d.get("load_in_4bit") is True, d.get("load_in_8bit") is True
    if adapter in ("lora", "qlora"):
        if adapter == "qlora" and not four:
            t.problems.append(f"{where}: adapter qlora needs load_in_4bit: true (axolotl refuses it without)")
        t.put("use_peft", True, f"adapter {adapter}")
        for key, on in (("load_in_4bit", four), ("load_in_8bit", eight)):
            if on:
                t.put(key, True, key)
        if d.get("lora_modules_to_save"):
            t.put("lora_modules_to_save", d["lora_modules_to_save"], "lora_modules_to_save")
        for key, file_key in (("lora_r", "lora_r"), ("lora_alpha", "lora_alpha")):
            if d.get(file_key) is None:
                t.problems.append(f"{where}: adapter {adapter} without {file_key}: axolotl has no default for it")
            else:
                t.put(key, d[file_key], file_key)
        t.default("lora_dropout", "lora_dropout", 0.0)
        if d.get("lora_target_linear"):
            t.put("lora_target_modules", "all-linear", "lora_target_linear")
        elif d.get("lora_target_modules") is not None:
            t.put("lora_target_modules", d["lora_target_modules"], "lora_target_modules")
        if d.get("peft_use_dora"):
            t.put("use_dora", True, "peft_use_dora")
    elif adapter is not None:
        t.problems.append(f"{where}: adapter {adapter!r} is not planned (lora or qlora)")
    elif four or eight:
        t.problems.append(f"{where}: load_in_4bit / load_in_8bit without an adapter: axolotl refuses a quantized "
                          "base without one")
    t.default("max_length", "sequence_len", 512)
    t.default("packing", "sample_packing", False)
    if d.get("pad_to_sequence_len") is True and not d.get("sample_packing"):
        t.put("padding", "max_length", "pad_to_sequence_len")
    t.default("per_device_train_batch_size", "micro_batch_size", 1)
    t.default("gradient_accumulation_steps", "gradient_accumulation_steps", 1)
    t.default("optim", "optimizer", "adamw_torch_fused")
    _axolotl_precision(t)
    checkpointing = d.get("gradient_checkpointing", False)
    t.put("gradient_checkpointing", bool(checkpointing), "gradient_checkpointing" if "gradient_checkpointing" in d
          else "no gradient_checkpointing (axolotl's default: off)")
    if d.get("gradient_checkpointing_kwargs") is not None:
        t.put("gradient_checkpointing_kwargs", d["gradient_checkpointing_kwargs"], "gradient_checkpointing_kwargs")
    elif checkpointing and d.get("unfrozen_parameters") is None and d.get("rl") is None:
        t.put("gradient_checkpointing_kwargs", {"use_reentrant": True},
              "no gradient_checkpointing_kwargs (axolotl's default with checkpointing)")
    if isinstance(checkpointing, str):
        t.warnings.append(f"{where}: gradient_checkpointing {checkpointing}: the offload of checkpoints to the "
                          "host is not modelled (planned as full checkpointing on the GPU)")
    for key, name in AX_ATTENTION.items():
        if d.get(key) and "attn_implementation" not in d:
            t.put("attn_implementation", name, key)
    if "attn_implementation" in d:
        t.put("attn_implementation", d["attn_implementation"], "attn_implementation")
    if d.get("fsdp") or d.get("fsdp_config"):
        _axolotl_fsdp(t)
    if d.get("rl") in AXOLOTL_DPO:  # axolotl builds TRL's DPOConfig (core/trainers/dpo/__init__.py)
        t.put("rl", d["rl"], "rl")
        if d.get("precompute_ref_log_probs") is not None:
            t.put("precompute_ref_log_probs", d["precompute_ref_log_probs"], "precompute_ref_log_probs")
    elif d.get("rl") == "grpo":
        _axolotl_grpo(t)
    elif d.get("rl") == "kto":  # axolotl builds TRL's KTOConfig (core/builders/rl.py), the weights always
        t.put("rl", "kto", "rl")
        for key in ("desirable_weight", "undesirable_weight"):
            t.default(key, f"kto_{key}", 1.0)


#: GRPOConfig keys axolotl's ``GRPOStrategy.set_training_args_kwargs`` copies from the ``trl:`` block
#: when set (core/trainers/grpo/__init__.py).
AX_GRPO_KEYS = ("generation_batch_size", "num_iterations")


def _axolotl_grpo(t: Translation) -> None:
    """``rl: grpo``: the GRPOConfig axolotl builds (core/trainers/grpo/__init__.py
    ``GRPOStrategy.set_training_args_kwargs``; core/builders/rl.py): ``trl.num_generations``
    (GRPOConfig's 8 when unset), ``trl.max_completion_length`` (passed even when unset: None, an
    unbounded completion, is a problem here), beta from ``trl.beta`` or ``rl_beta`` (else
    GRPOConfig's 0.0), ``trl.use_vllm`` with ``trl.vllm_mode`` (axolotl's default with vLLM:
    server, utils/schemas/validation.py ``check_vllm_mode_set``) and, colocated, the ``vllm:``
    block's ``gpu_memory_utilization`` (0.9 by axolotl's schema) and ``tensor_parallel_size``, and
    ``trl.vllm_enable_sleep_mode``. Neither TRL nor axolotl cuts a GRPO prompt to ``sequence_len``
    (axolotl's GRPO blocklist drops ``max_length``; utils/data/rl.py keeps every GRPO sample): the
    plan takes ``sequence_len`` as the longest prompt plus completion, and says so."""
    d, where = t.d, t.where
    trl = d.get("trl") or {}
    vllm = d.get("vllm") or {}
    for name, block in (("trl", trl), ("vllm", vllm)):
        if not isinstance(block, dict):
            t.problems.append(f"{where}: {name} must be a mapping of options (axolotl's schema refuses "
                              f"{type(block).__name__})")
            return
    groups = GRPO_DEFAULTS["num_generations"]
    t.put("num_generations", trl.get("num_generations") or groups, "trl.num_generations" if trl.get("num_generations")
          else f"no trl.num_generations (GRPOConfig's default, {groups})")
    if trl.get("max_completion_length") is None:
        t.problems.append(f"{where}: rl grpo without trl.max_completion_length: axolotl passes None, a completion of "
                          "unbounded length; set trl.max_completion_length")
    else:
        t.put("max_completion_length", trl["max_completion_length"], "trl.max_completion_length")
    beta, said = (trl.get("beta"), "trl.beta") if trl.get("beta") is not None else (d.get("rl_beta"), "rl_beta")
    default = GRPO_DEFAULTS["beta"]
    t.put("beta", beta if beta is not None else default, said if beta is not None else "no trl.beta or rl_beta "
          f"(GRPOConfig's default, {default})")
    for key in AX_GRPO_KEYS:
        if trl.get(key) is not None:
            t.put(key, trl[key], f"trl.{key}")
    t.put("use_vllm", bool(trl.get("use_vllm")), "trl.use_vllm" if "use_vllm" in trl
          else "no trl.use_vllm (axolotl's default, false)")
    if trl.get("use_vllm"):
        mode = trl.get("vllm_mode") or "server"
        t.put("vllm_mode", mode, "trl.vllm_mode" if trl.get("vllm_mode") else
              "no trl.vllm_mode (axolotl's default with vLLM, server)")
        if mode == "colocate":
            t.put("vllm_gpu_memory_utilization", vllm.get("gpu_memory_utilization", 0.9),
                  "vllm.gpu_memory_utilization" if "gpu_memory_utilization" in vllm
                  else "no vllm.gpu_memory_utilization (axolotl's default, 0.9)")
            if vllm.get("tensor_parallel_size") is not None:
                t.put("vllm_tensor_parallel_size", vllm["tensor_parallel_size"], "vllm.tensor_parallel_size")
            if trl.get("vllm_enable_sleep_mode") is not None:
                t.put("vllm_enable_sleep_mode", trl["vllm_enable_sleep_mode"], "trl.vllm_enable_sleep_mode")
    t.warnings.append(f"{where}: rl grpo: neither axolotl nor TRL cuts a prompt to sequence_len "
                      f"({d.get('sequence_len', 512)}): planned as the longest prompt plus the completion; longer "
                      "prompts need more memory than planned")


def _axolotl_precision(t: Translation) -> None:
    """bf16 (default "auto": bf16 where the GPU has it) or fp16 are the Trainer's flags, and the
    dtype the model loads in; bfloat16 / float16 load in that dtype without autocast."""
    d = t.d
    if d.get("bfloat16") or d.get("float16"):
        key = "bfloat16" if d.get("bfloat16") else "float16"
        t.put("torch_dtype", key, key)
        return
    bf16 = d.get("bf16", "auto")
    if d.get("fp16") and bf16 in ("auto", None, False):
        t.put("fp16", True, "fp16")
        return
    if bf16 == "auto" or bf16 is True:
        origin = "bf16" if "bf16" in d else "no bf16 (axolotl's default, auto)"
        t.put("bf16", True, origin + (" (auto: bf16 on GPUs that have it)" if bf16 == "auto" and "bf16" in d else ""))
        t.put("torch_dtype", "bfloat16", origin + " (the model loads in bf16)")


def _axolotl_fsdp(t: Translation) -> None:
    """axolotl's ``fsdp`` options and ``fsdp_config`` (keys without their ``fsdp_`` prefix, the
    version from ``fsdp_version`` anywhere, FSDP1 when none is given) as the Trainer's."""
    d = t.d
    raw = d.get("fsdp_config") or {}
    if not isinstance(raw, dict):
        t.problems.append(f"{t.where}: fsdp_config must be a mapping of FSDP options (axolotl's schema refuses "
                          f"{type(raw).__name__})")
        raw = {}
    config = {str(k).removeprefix("fsdp_"): v for k, v in raw.items()}
    version = config.pop("version", d.get("fsdp_version", 1))
    config["version"] = version
    where = "fsdp_version" if "fsdp_version" in d or "fsdp_version" in raw or "version" in raw else \
        "no fsdp_version (axolotl's default with an fsdp_config: 1)"
    options = d.get("fsdp")
    t.put("fsdp", " ".join(map(str, options)) if isinstance(options, list) else (options or "full_shard"), "fsdp")
    t.put("fsdp_config", config, f"fsdp_config ({where})")


def check_keys(framework: str, d: dict, installed: frozenset[str], where: str) -> tuple[list[str], list[str]]:
    """(problems, warnings) for a framework file's keys. LLaMA-Factory refuses a key that none of its
    releases and no transformers version has (HfArgumentParser); a key only other releases have
    warns. axolotl ignores unknown keys: each warns, with "did you mean"."""
    sets = recipe_keys()
    versions, keys = sets[framework]
    own = set(keys) | (set(installed) | set(sets["transformers"][1]) if framework == LLAMAFACTORY else set())
    unknown = [k for k in sorted(map(str, d)) if k not in own and k not in DEGREE_KEYS[framework]]
    older = [k for k in sorted(map(str, d)) if k in keys and len(versions) - 1 not in keys[k]]
    problems, warnings, name = [], [], NAMES[framework]
    named = ", ".join(k + suggestion(k, own) for k in unknown)
    if unknown and framework == LLAMAFACTORY:
        problems.append(f"{where}: unknown key(s) {named}: no LLaMA-Factory ({versions[0]} to @{versions[-1]}) or "
                        "transformers version has them, and llamafactory-cli refuses unknown keys")
    elif unknown:
        warnings.append(f"{where}: unknown key(s) {named}: no axolotl release ({versions[0]} to @{versions[-1]}) has "
                        "them; axolotl ignores them")
    if older:
        spans = ", ".join(f"{k} ({name} {versions[keys[k][0]]} to {versions[keys[k][-1]]})" for k in older)
        warnings.append(f"{where}: keys of older {name} releases only: {spans}; run the file with such a release")
    return problems, warnings
