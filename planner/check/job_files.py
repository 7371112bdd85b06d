"""Reading a job's own files into the configuration vocabulary, for `planner check`.

accelerate YAML, DeepSpeed JSON and Trainer arguments (JSON or YAML) are mapped field by field;
every mapped value remembers where it came from. Keys the libraries do not know are bad input
(the key sets ship in data/known_keys.json, kept equal to the installed libraries by a test);
keys that are valid but that the planner does not model are named in warnings. Two files that
disagree on a field are a contradiction (bad input), not silently resolved.
"""

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from planner.catalog import DATA_DIR
from planner.catalog.files import read_mapping

#: TRL's SFTConfig sequence-length keys (a TrainingArguments subclass that most SFT jobs use).
SEQ_LEN_KEYS = ("max_seq_length", "max_length")
#: Trainer `optim` names -> vocabulary (transformers OptimizerNames; aliases included).
TRAINER_OPTIMIZERS = {
    "adamw_torch": "adamw", "adamw_torch_fused": "adamw", "adamw_hf": "adamw", "adamw_apex_fused": "adamw",
    "adamw_8bit": "adamw-8bit", "adamw_bnb_8bit": "adamw-8bit", "paged_adamw_32bit": "paged-adamw",
    "paged_adamw_8bit": "paged-adamw-8bit", "adafactor": "adafactor", "lion_32bit": "lion", "lion_8bit": "lion-8bit",
    "sgd": "sgd",
}
DEEPSPEED_OPTIMIZERS = {"adamw": "adamw", "adam": "adamw", "lion": "lion"}
NOT_MIXED = "not mixed"  # accelerate "no" / Trainer without bf16, fp16: fp32, or bf16-pure if the model loads in bf16
#: A reading that a more specific one refines, rather than contradicts: "not mixed" is fp32 or
#: bf16-pure; the Trainer's bf16 flag next to accelerate's fp8 is an fp8 job (bf16 outside the
#: fp8 matmuls); the Trainer's full_shard next to accelerate's parallelism_config is hybrid
#: sharding (the Trainer takes parallelism from accelerate).
REFINES = {NOT_MIXED: {"fp32", "bf16-pure"}, "bf16-mixed": {"fp8-mixed"}, "fsdp": {"fsdp-hybrid"}}
MAX_COUNT = 1_000_000


@cache
def known_keys() -> dict[str, frozenset[str]]:
    data = json.loads((DATA_DIR / "known_keys.json").read_text())
    return {k: frozenset(v) for k, v in data.items() if k != "source"}


@dataclass
class Reading:
    """What the files say, with sources; problems are bad input, warnings are unmodelled."""

    values: dict[str, tuple[Any, str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    processes: tuple[int, str] | None = None  # accelerate num_processes (all machines)
    machines: tuple[int, str] | None = None
    train_batch: tuple[int, str] | None = None  # DeepSpeed train_batch_size

    def set(self, name: str, value: Any, where: str) -> None:
        old = self.values.get(name)
        if old is None or value in REFINES.get(old[0], ()):
            self.values[name] = (value, where)
        elif old[0] != value and old[0] not in REFINES.get(value, ()):
            self.problems.append(f"contradiction: {where} means {name} {value}, but {old[1]} means {old[0]}")


def _typed(d: dict, key: str, kinds: tuple, where: str, r: Reading, default=None, allow_auto: bool = False):
    """d[key] if it has one of ``kinds`` (and, for ints, a sane range), else a problem."""
    if key not in d or d[key] is None:
        return default
    v = d[key]
    if allow_auto and v == "auto":
        return None
    if bool in kinds and isinstance(v, str) and v.lower() in ("true", "false"):
        return v.lower() == "true"
    ok = isinstance(v, kinds) and not (isinstance(v, bool) and bool not in kinds)
    if ok and isinstance(v, int) and not isinstance(v, bool) and not 0 <= v <= MAX_COUNT:
        r.problems.append(f"{where}: {key} = {v} is out of range (0 to {MAX_COUNT:,})")
        return default
    if not ok:
        names = "/".join("true or false" if k is bool else {int: "an integer", str: "a string", dict: "a mapping",
                                                                 float: "a number", list: "a list"}[k] for k in kinds)
        r.problems.append(f"{where}: {key} must be {names}, not {v!r}"[:300])
        return default
    return v


def _section(d: dict, key: str, where: str, r: Reading) -> dict:
    """A nested mapping (``{}`` when absent); anything else is a problem."""
    value = d.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        r.problems.append(f"{where}: {key} must be a mapping, not {value!r}"[:300])
        return {}
    return value


def _unknown(d: dict, known: frozenset[str], where: str, what: str, r: Reading, extra: tuple = ()) -> None:
    unknown = sorted(str(k) for k in d if k not in known and k not in extra)
    if unknown:
        r.problems.append(f"{where}: unknown key(s) {', '.join(unknown)}: {what} has no such key")


def read_accelerate(path: Path, r: Reading) -> Path | None:
    """Map an accelerate config; returns the DeepSpeed JSON it points at, if any."""
    d = read_mapping(path, "accelerate config")
    where = path.name
    _unknown(d, known_keys()["accelerate"], where, "accelerate's config", r)
    dt = _typed(d, "distributed_type", (str,), where, r, "NO")
    machines = _typed(d, "num_machines", (int,), where, r, 1)
    processes = _typed(d, "num_processes", (int,), where, r, 1)
    r.machines, r.processes = (machines, f"{where}: num_machines"), (processes, f"{where}: num_processes")
    if _typed(d, "use_cpu", (bool,), where, r, False):
        r.problems.append(f"{where}: use_cpu is true: planner plans GPU jobs")
    if d.get("dynamo_config"):
        r.warnings.append(f"{where}: dynamo_config (torch.compile) is not modelled; its speed-up and memory are not counted")
    mp = _typed(d, "mixed_precision", (str,), where, r, "no")
    ds_file = None
    if dt == "DEEPSPEED":
        ds = _section(d, "deepspeed_config", where, r)
        ds_file = ds.get("deepspeed_config_file")
        if ds_file is None:
            _inline_deepspeed(ds, where, r)
            _map_mixed_precision(mp, f"{where}: mixed_precision", r)
        elif not isinstance(ds_file, str):
            r.problems.append(f"{where}: deepspeed_config.deepspeed_config_file must be a path")
            ds_file = None
    else:
        _map_mixed_precision(mp, f"{where}: mixed_precision", r)
    if dt == "NO":
        r.set("sharding", "none" if (processes or 1) <= 1 else "ddp", f"{where}: distributed_type NO")
    elif dt == "MULTI_GPU":
        r.set("sharding", "ddp", f"{where}: distributed_type MULTI_GPU")
    elif dt == "FSDP":
        par = _section(d, "parallelism_config", where, r)
        replicas = par.get("parallelism_config_dp_replicate_size", 1)
        hybrid = isinstance(replicas, int) and not isinstance(replicas, bool) and replicas > 1
        _fsdp(_section(d, "fsdp_config", where, r), where, r, accelerate=True,
              options=["hybrid_shard"] if hybrid else None)
    elif dt is not None and dt != "DEEPSPEED":
        r.problems.append(f"{where}: distributed_type {dt} is not planned (planner plans NO, MULTI_GPU, FSDP, DEEPSPEED)")
    fp8 = _section(d, "fp8_config", where, r)
    if str(fp8.get("backend", "AO")).upper() != "AO":
        r.warnings.append(f"{where}: fp8 backend {fp8.get('backend')} is modelled as torchao fp8")
    return _beside(path, ds_file) if ds_file else None


def _beside(path: Path, named: str) -> Path:
    """A file another file names: relative to that file's folder if it is there, else as given."""
    candidate = Path(named) if Path(named).is_absolute() else path.parent / named
    try:
        return candidate if candidate.exists() else Path(named)
    except (OSError, ValueError):  # unreadable or impossible names (e.g. a NUL byte) fail when read
        return Path(named)


def _map_mixed_precision(mp: str | None, where: str, r: Reading) -> None:
    mapping = {"no": NOT_MIXED, "fp16": "fp16-mixed", "bf16": "bf16-mixed", "fp8": "fp8-mixed"}
    if mp is None:
        return
    if str(mp) not in mapping:
        r.problems.append(f"{where}: mixed_precision {mp!r} is not one of {', '.join(mapping)}")
        return
    r.set("precision", mapping[str(mp)], where)


def _inline_deepspeed(ds: dict, where: str, r: Reading) -> None:
    """accelerate's inline DeepSpeed keys (no JSON file)."""
    stage = ds.get("zero_stage")
    if stage is not None:
        _stage(stage, f"{where}: deepspeed_config.zero_stage", r)
    opt_dev, param_dev = ds.get("offload_optimizer_device"), ds.get("offload_param_device")
    _offload(opt_dev, param_dev, f"{where}: deepspeed_config", r)
    accum = ds.get("gradient_accumulation_steps")
    if isinstance(accum, int) and not isinstance(accum, bool):
        r.set("grad_accum", accum, f"{where}: deepspeed_config.gradient_accumulation_steps")


def _stage(stage: Any, where: str, r: Reading) -> None:
    if not isinstance(stage, int) or isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        r.problems.append(f"{where}: ZeRO stage must be 0, 1, 2 or 3, not {stage!r}")
        return
    r.set("sharding", {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}[stage], where)


def _offload(opt_dev: Any, param_dev: Any, where: str, r: Reading) -> None:
    devices = {None: False, "none": False, "cpu": True, "nvme": True}
    for dev in (opt_dev, param_dev):
        if not isinstance(dev, (str, type(None))) or dev not in devices:
            r.problems.append(f"{where}: offload device must be none, cpu or nvme, not {dev!r}")
            return
    if "nvme" in (opt_dev, param_dev):
        r.warnings.append(f"{where}: NVMe offload is modelled as CPU offload (host RAM is then overstated)")
    if devices[param_dev]:
        r.set("offload", "optimizer+params", where)
    elif devices[opt_dev]:
        r.set("offload", "optimizer", where)


def read_deepspeed(path: Path, r: Reading) -> None:
    read_deepspeed_dict(read_mapping(path, "DeepSpeed config"), path.name, r)


def read_deepspeed_dict(d: dict, where: str, r: Reading) -> None:
    zero = _section(d, "zero_optimization", where, r)
    _unknown(zero, known_keys()["deepspeed_zero"], f"{where}: zero_optimization", "DeepSpeed's ZeRO config", r)
    if "stage" in zero:
        _stage(zero["stage"], f"{where}: zero_optimization.stage", r)
    devices = [_section(zero, key, f"{where}: zero_optimization", r).get("device")
               for key in ("offload_optimizer", "offload_param")]
    _offload(*devices, f"{where}: zero_optimization", r)
    bf16 = _typed(_section(d, "bf16", where, r), "enabled", (bool,), f"{where}: bf16", r, False, allow_auto=True)
    fp16 = _typed(_section(d, "fp16", where, r), "enabled", (bool,), f"{where}: fp16", r, False, allow_auto=True)
    if bf16 and fp16:
        r.problems.append(f"contradiction: {where} enables both bf16 and fp16")
    elif bf16:
        r.set("precision", "bf16-mixed", f"{where}: bf16.enabled")
    elif fp16:
        r.set("precision", "fp16-mixed", f"{where}: fp16.enabled")
    mbs = _typed(d, "train_micro_batch_size_per_gpu", (int,), where, r, allow_auto=True)
    accum = _typed(d, "gradient_accumulation_steps", (int,), where, r, allow_auto=True)
    total = _typed(d, "train_batch_size", (int,), where, r, allow_auto=True)
    if mbs:
        r.set("micro_batch_size", mbs, f"{where}: train_micro_batch_size_per_gpu")
    if accum:
        r.set("grad_accum", accum, f"{where}: gradient_accumulation_steps")
    if total:
        r.train_batch = (total, f"{where}: train_batch_size")
    opt = _section(d, "optimizer", where, r)
    if isinstance(opt.get("type"), str):
        name = DEEPSPEED_OPTIMIZERS.get(opt["type"].lower())
        if name:
            r.set("optimizer", name, f"{where}: optimizer.type {opt['type']}")
        else:
            r.warnings.append(f"{where}: DeepSpeed optimizer {opt['type']} is not modelled; states counted as AdamW's")
    if d.get("activation_checkpointing"):
        r.warnings.append(f"{where}: DeepSpeed's activation_checkpointing applies only through its own API; not modelled")


def read_training_args(path: Path, r: Reading) -> Path | dict | None:
    """Map Trainer arguments; returns the DeepSpeed config they name (a path or an inline dict)."""
    d = read_mapping(path, "training arguments")
    where = path.name
    _unknown(d, known_keys()["training_args"], where, "transformers.TrainingArguments", r, extra=SEQ_LEN_KEYS)
    mbs = _typed(d, "per_device_train_batch_size", (int,), where, r)
    accum = _typed(d, "gradient_accumulation_steps", (int,), where, r)
    if mbs is not None:
        r.set("micro_batch_size", mbs, f"{where}: per_device_train_batch_size")
    if accum is not None:
        r.set("grad_accum", accum, f"{where}: gradient_accumulation_steps")
    bf16, fp16 = (_typed(d, k, (bool,), where, r, False) for k in ("bf16", "fp16"))
    if bf16 and fp16:
        r.problems.append(f"contradiction: {where} sets both bf16 and fp16")
    elif bf16 or fp16:
        r.set("precision", "bf16-mixed" if bf16 else "fp16-mixed", f"{where}: {'bf16' if bf16 else 'fp16'}")
    elif "bf16" in d or "fp16" in d:
        r.set("precision", NOT_MIXED, f"{where}: bf16 and fp16 off")
    optim = _typed(d, "optim", (str,), where, r)
    if optim is not None:
        if optim in TRAINER_OPTIMIZERS:
            r.set("optimizer", TRAINER_OPTIMIZERS[optim], f"{where}: optim {optim}")
        else:
            r.warnings.append(f"{where}: optim {optim} is not modelled; its states are counted as AdamW's")
    if any(_typed(d, k, (bool,), where, r, False) for k in ("gradient_checkpointing", "activation_checkpointing")):
        r.set("checkpointing", "full", f"{where}: activation checkpointing on")
    if _typed(d, "use_liger_kernel", (bool,), where, r) is not None:
        r.set("loss", "chunked" if d["use_liger_kernel"] is True else "standard", f"{where}: use_liger_kernel")
    for key in SEQ_LEN_KEYS:
        seq = _typed(d, key, (int,), where, r)
        if seq:
            r.set("seq_len", seq, f"{where}: {key}")
    if d.get("torch_compile"):
        r.warnings.append(f"{where}: torch_compile is not modelled")
    fsdp = d.get("fsdp")
    if fsdp:
        config = d.get("fsdp_config") or {}
        if not isinstance(config, dict):
            r.problems.append(f"{where}: fsdp_config must be a mapping (a path to a JSON file is not read)")
            config = {}
        options = fsdp.split() if isinstance(fsdp, str) else (fsdp if isinstance(fsdp, list) else [])
        _fsdp(config, where, r, accelerate=False, options=[str(o) for o in options])
    ds = d.get("deepspeed")
    if ds is not None and not isinstance(ds, (str, dict)):
        r.problems.append(f"{where}: deepspeed must be a path or a mapping")
        return None
    if isinstance(ds, str):
        return _beside(path, ds)
    return ds


def _fsdp(cfg: dict, where: str, r: Reading, accelerate: bool, options: list[str] | None = None) -> None:
    """FSDP settings from accelerate's fsdp_config (fsdp_* keys) or the Trainer's (bare keys)."""
    key = (lambda k: f"fsdp_{k}") if accelerate else (lambda k: k)
    version = cfg.get(key("version"), 1 if accelerate else 2)
    if version not in (1, 2, "1", "2"):
        r.problems.append(f"{where}: FSDP version must be 1 or 2, not {version!r}")
        return
    if str(version) == "1":
        r.warnings.append(f"{where}: FSDP1 is modelled as FSDP2 (same sharding, per-layer units)")
    strategy = str(cfg.get(key("sharding_strategy"), "")).upper()
    reshard = cfg.get(key("reshard_after_forward"), True)
    options = options or []
    if "SHARD_GRAD_OP" in strategy or strategy == "2" or "shard_grad_op" in options or reshard in (False, "false"):
        sharding = "fsdp-grad-op"
    elif "HYBRID" in strategy or "hybrid_shard" in options or strategy in ("4", "5"):
        sharding = "fsdp-hybrid"
    elif "NO_SHARD" in strategy or strategy == "3":
        sharding = "ddp"
    else:
        sharding = "fsdp"
    r.set("sharding", sharding, f"{where}: FSDP ({'accelerate' if accelerate else 'Trainer'} fsdp_config)")
    offload = cfg.get(key("offload_params"), cfg.get("cpu_offload", False)) or "offload" in options
    if offload in (True, "true"):
        r.set("offload", "optimizer+params", f"{where}: FSDP parameter offload")
    ckpt = cfg.get(key("activation_checkpointing"), False)
    if ckpt in (True, "true"):
        r.set("checkpointing", "full", f"{where}: FSDP activation checkpointing")
