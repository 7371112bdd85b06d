"""Reading a job's own files into the configuration vocabulary, for `planner check`.

accelerate YAML, DeepSpeed JSON, Trainer arguments (JSON or YAML) and planner's runtime.json
(planner.core.launch_contract: what the planner launch applies beyond them) are parsed here into a
``JobFiles`` (planner/core/job.py); this module reads what belongs to no technique (unknown keys,
process and machine counts, the workload: micro-batch, accumulation, sequence length, global batch)
and every registered strategy's ``read`` maps its own keys onto its field. Every mapped value
remembers where it came from. Keys are judged as each library's loader judges them: accelerate's
config and DeepSpeed's ZeRO section refuse unknown keys (bad input, with "did you mean"; the key
sets ship in data/known_keys.json, kept equal to the installed libraries by a test); DeepSpeed
ignores an unknown top-level key (a warning); Trainer/TRL recipes are judged across the library
versions people pin (planner/check/recipe_keys.py). Legacy keys are read as the libraries convert
them; keys that are valid but that the planner does not model are named in warnings. Two files
that disagree on a field are a contradiction (bad input), not silently resolved.
"""

import json
import re
from collections.abc import Mapping
from functools import cache, partial
from pathlib import Path

from pydantic import ValidationError

from planner.catalog import DATA_DIR
from planner.catalog.files import read_mapping
from planner.check.frameworks import check_keys, detect, translate
from planner.check.methods import REFUSAL, REFUSAL_HINT, trl_method
from planner.check.recipe_keys import read_recipe_keys, suggestion
from planner.core.errors import PlannerInputError
from planner.core.job import FsdpSettings, JobFiles, Reading
from planner.core.launch_contract import RUNTIME_FILE, RuntimeArgs
from planner.core.lengths import Batching
from planner.strategies import TECHNIQUES

#: TRL's SFTConfig sequence-length keys (a TrainingArguments subclass that most SFT jobs use).
SEQ_LEN_KEYS = ("max_seq_length", "max_length")
#: The files a job directory may hold (``planner suggest --out`` writes them under these names).
JOB_FILES = {"accelerate_config": "accelerate_config.yaml", "deepspeed_config": "deepspeed_config.json",
             "training_args": "training_args.json", "runtime_args": RUNTIME_FILE}
#: Other names ``check --job-dir`` finds them under in a user's own job folder (TRL and the
#: Trainer read their arguments from YAML as often as JSON; accelerate writes .yaml or .yml).
JOB_DIR_ALSO = {"training_args": ("training_args.yaml", "training_args.yml"),
                "accelerate_config": ("accelerate_config.yml",)}


@cache
def known_keys() -> dict[str, frozenset[str]]:
    data = json.loads((DATA_DIR / "known_keys.json").read_text())
    return {k: frozenset(v) for k, v in data.items() if k != "source"}


def read_job(paths: Mapping[str, Path | None], method: str | None = None,
             gpus: tuple[int, int] | None = None) -> Reading:
    """Read the files at ``paths`` (JOB_FILES keys, and ``torchtitan_config``; None: not given) and
    every technique in them. Unreadable files and what the files get wrong are raised together as
    one PlannerInputError. ``method``: the training method the user names (``--method``), which
    settles a recipe whose keys two methods share (planner/check/methods.py); ``gpus``: the job's
    GPUs and a node's (a torchtitan TOML's degrees resolve against them; None: the launcher's,
    unknown here, as in the planner launch, whose world is the files' own)."""
    r = Reading()
    if (titan := paths.get("torchtitan_config")) is not None:
        if gpus is None:
            raise PlannerInputError("a torchtitan config's degrees need the job's GPUs", hint="Pass --gpus.")
        return _torchtitan_job(titan, [k for k in JOB_FILES if paths.get(k) is not None], r, gpus)
    errors: list[str] = []
    parts: dict = {}
    ds_source: Path | dict | None = paths.get("deepspeed_config")
    for key, reader in (("accelerate_config", partial(_accelerate, gpus=gpus)),
                        ("training_args", partial(_training_args, method=method))):
        path = paths.get(key)
        if path is None:
            continue
        try:
            named = reader(path, r, parts)
        except PlannerInputError as e:
            errors += e.problems
            continue
        if isinstance(named, dict):  # inline in the Trainer arguments
            parts |= {"deepspeed": named, "deepspeed_where": f"{path.name}: deepspeed"}
        elif named is not None and ds_source is None:
            ds_source = named
    if (runtime_path := paths.get("runtime_args")) is not None:
        try:
            _runtime(runtime_path, r, parts)
        except PlannerInputError as e:
            errors += e.problems
    if isinstance(ds_source, Path):
        try:
            parts |= {"deepspeed": read_mapping(ds_source, "DeepSpeed config"), "deepspeed_where": ds_source.name}
        except PlannerInputError as e:
            errors += e.problems
    if parts.get("deepspeed_where"):
        _deepspeed(parts["deepspeed"], parts["deepspeed_where"], r)
    origins = parts.pop("origins", {})
    job = JobFiles(**parts)
    for strategy in TECHNIQUES:
        strategy.read(job, r)
    _name_origins(r, origins)
    if errors or r.problems:  # (several readers may trip over one malformed section: each said once)
        problems = list(dict.fromkeys(errors + r.problems))
        refused = all(REFUSAL in p for p in problems)
        raise PlannerInputError(problems, hint=REFUSAL_HINT if refused else
                                "Fix the files (or the flags) and run planner check again.")
    return r


def _torchtitan_job(path: Path, others: list[str], r: Reading, gpus: tuple[int, int]) -> Reading:
    """A torchtitan job: its TOML alone says how it runs (planner/check/torchtitan.py)."""
    from planner.check.torchtitan import UNMODELLED, read_torchtitan

    if others:
        raise PlannerInputError(f"{path.name} is a torchtitan config, which alone says how its job runs; "
                                f"{', '.join(others)} belong to other launchers",
                                hint="Check the torchtitan job with its TOML alone.")
    read_torchtitan(path, r, *gpus)
    if r.problems:
        unmodelled = any(UNMODELLED in p for p in r.problems)
        raise PlannerInputError(list(dict.fromkeys(r.problems)), hint=(
            "planner cannot give this job a verdict: what it names is not modelled yet. Check it with the change "
            "the reason names, or measure it." if unmodelled else "Fix the file (or --gpus) and run planner check "
                                                                   "again."))
    return r


def _name_origins(r: Reading, origins: dict[str, dict[str, str]]) -> None:
    """Sources and messages name the key a framework file has (or its default), not the Trainer key
    it was translated to: "f.yaml: max_length" -> "f.yaml: cutoff_len"."""
    for where, names in origins.items():
        if not names:
            continue
        pattern = re.compile(rf"{re.escape(where)}: ({'|'.join(map(re.escape, sorted(names, key=len, reverse=True)))})\b")

        def rename(text: str, pattern=pattern, where=where, names=names) -> str:
            return pattern.sub(lambda m: f"{where}: {names[m.group(1)]}", text)

        r.values = {k: (v, rename(src)) for k, (v, src) in r.values.items()}
        r.problems, r.warnings = [rename(x) for x in r.problems], [rename(x) for x in r.warnings]


def _batching(d: dict, where: str, r: Reading) -> None:
    """How a TRL recipe batches (planner/core/lengths.py): ``packing`` true packs rows of
    ``max_length``; false puts one sample in each row, padded to the micro-batch's longest (TRL's
    collators), or to the length where a framework file says so (axolotl's ``pad_to_sequence_len``,
    translated as ``padding: max_length``: planner/check/frameworks.py). TRL's ``padding_free`` (rows
    concatenated without padding, for flash-attention's variable-length kernels) is refused: not
    modelled."""
    if d.get("padding_free") is True:
        r.problems.append(f"{where}: padding_free true: batches without padding (flash-attention's variable-length "
                          "kernels) are not modelled; plan it as packing true, or padded with --lengths")
    packing = d.get("packing")
    if packing is True:
        r.set("batching", Batching.PACKED, f"{where}: packing true")
    elif packing is False:
        to_max = d.get("padding") == "max_length"
        r.set("batching", Batching.PADDED_MAX if to_max else Batching.PADDED,
              f"{where}: packing false" + (", padding max_length" if to_max else ""))


def _runtime(path: Path, r: Reading, parts: dict) -> None:
    """runtime.json (planner.core.launch_contract): its format, the sequence length; each technique reads its key."""
    d = read_mapping(path, "planner runtime arguments")
    try:
        args = RuntimeArgs.model_validate(d)
    except ValidationError as e:
        r.problems += [f"{path.name}: {'.'.join(map(str, er['loc'])) or 'file'}: {er['msg']}" for er in e.errors()]
        return
    parts |= {"runtime": args.model_dump(), "runtime_where": path.name}
    r.set("seq_len", args.seq_len, f"{path.name}: seq_len")
    if "batching" in d:
        r.set("batching", args.batching, f"{path.name}: batching")


def _unknown(d: dict, known: frozenset[str]) -> str:
    """The keys of ``d`` not in ``known``, each with its "did you mean" ('' when none)."""
    return ", ".join(k + suggestion(k, known) for k in sorted(str(k) for k in d if k not in known))


def _refuse_unknown(d: dict, known: frozenset[str], where: str, what: str, r: Reading) -> None:
    if named := _unknown(d, known):
        r.problems.append(f"{where}: unknown key(s) {named}: {what} has no such key")


def _sagemaker(d: dict, where: str, r: Reading) -> None:
    """An accelerate config for Amazon SageMaker (compute_environment AMAZON_SAGEMAKER: accelerate
    reads it as its SageMakerConfig): its own keys (its distributed_type: strategies/sharding.py);
    the instance type is not read (the GPUs are --gpus)."""
    _refuse_unknown(d, known_keys()["accelerate_sagemaker"], where, "accelerate's SageMaker config", r)
    if "ec2_instance_type" in d:
        r.warnings.append(f"{where}: ec2_instance_type {str(d['ec2_instance_type'])[:80]} is not read: the GPUs "
                          "are --gpus (one process per GPU, as SageMaker starts them)")


def _accelerate(path: Path, r: Reading, parts: dict, gpus: tuple[int, int] | None = None) -> Path | None:
    """The accelerate config: its own keys, processes and machines, its FSDP and inline DeepSpeed
    settings for the strategies, its parallelism sizes against the job's GPUs (``gpus``: all, a
    node's); returns the DeepSpeed JSON it points at, if any."""
    d = _accelerate_legacy(read_mapping(path, "accelerate config"))
    where = path.name
    if d.get("distributed_type") is False:  # YAML 1.1 reads an unquoted NO as false (accelerate writes 'NO')
        d["distributed_type"] = "NO"
    sagemaker = d.get("compute_environment") == "AMAZON_SAGEMAKER"
    if sagemaker:
        _sagemaker(d, where, r)
    else:
        _refuse_unknown(d, known_keys()["accelerate"], where, "accelerate's config", r)
    dt = r.typed(d, "distributed_type", (str,), where, "NO")
    machines = r.typed(d, "num_machines", (int,), where, 1)
    r.machines = (machines, f"{where}: num_machines")
    processes = None if sagemaker else r.typed(d, "num_processes", (int,), where, 1)  # (SageMaker: one per GPU)
    if processes is not None:
        r.processes = (processes, f"{where}: num_processes")
    if r.typed(d, "use_cpu", (bool,), where, False):
        r.problems.append(f"{where}: use_cpu is true: planner plans GPU jobs")
    if d.get("dynamo_config"):
        r.warnings.append(f"{where}: dynamo_config (torch.compile) is not modelled; its speed-up and memory are not counted")
    parts |= {"accelerate": d, "accelerate_where": where, "distributed_type": dt, "processes": processes}
    ds_file = None
    if dt == "DEEPSPEED":
        ds = r.section(d, "deepspeed_config", where)
        ds_file = ds.get("deepspeed_config_file")
        ignored = sorted(k for k in ds if k in DEEPSPEED_FILE_IGNORES) if ds_file is not None else []
        if ignored:
            r.problems.append(f"{where}: deepspeed_config sets {', '.join(ignored)} beside deepspeed_config_file; "
                              "accelerate refuses that (DeepSpeedPlugin: put them in the DeepSpeed config file)")
        if ds_file is None:
            parts["accelerate_inline_deepspeed"] = ds
            accum = ds.get("gradient_accumulation_steps")
            if isinstance(accum, int) and not isinstance(accum, bool):
                r.set("grad_accum", accum, f"{where}: deepspeed_config.gradient_accumulation_steps")
        elif not isinstance(ds_file, str):
            r.problems.append(f"{where}: deepspeed_config.deepspeed_config_file must be a path")
            ds_file = None
    par = r.section(d, "parallelism_config", where)
    _parallelism_sizes(par, f"{where}: parallelism_config", r, gpus)  # (each degree: its strategy's reader)
    if dt == "FSDP":
        replicas = par.get("parallelism_config_dp_replicate_size", 1)
        hybrid = isinstance(replicas, int) and not isinstance(replicas, bool) and replicas > 1
        _add_fsdp(parts, r.section(d, "fsdp_config", where), where, r, accelerate=True,
                  options=("hybrid_shard",) if hybrid else ())
    return beside(path, ds_file) if ds_file else None


#: accelerate's ParallelismConfig degrees (parallelism_config.py), in its mesh order.
PARALLELISM_SIZES = ("dp_replicate", "dp_shard", "cp", "sp", "tp")


def _parallelism_sizes(par: dict, where: str, r: Reading, gpus: tuple[int, int] | None) -> None:
    """accelerate's ParallelismConfig checks on the sizes the config names (each 1 unless set):
    their product is the processes (``_validate_accelerator``: "total_size ... does not match
    num_processes"; not with DeepSpeed's Ulysses, whose groups DeepSpeed forms), and tensor or
    context parallelism needs ``dp_shard_size`` above 1 where ``dp_replicate_size`` is (its
    ``__post_init__``). A tensor-parallel group is a node's GPUs or fewer, FSDP's shard group under
    replicas a node (what planner's layouts are: strategies/tensor_parallel.py). ``gpus`` None: the
    GPUs are not known here, nothing to hold the sizes against."""
    if not par or gpus is None:
        return
    sizes = {k: r.typed(par, f"parallelism_config_{k}_size", (int,), where, 1) or 1 for k in PARALLELISM_SIZES}
    total = sizes["dp_replicate"] * sizes["dp_shard"] * sizes["cp"] * sizes["sp"] * sizes["tp"]
    named = " x ".join(f"{k} {v}" for k, v in sizes.items())
    if sizes["sp"] == 1 and total not in (1, gpus[0]):
        r.problems.append(f"{where}: {named} = {total} processes, but the job runs {gpus[0]} (--gpus): accelerate "
                          "raises (ParallelismConfig total_size does not match num_processes)")
    elif (sizes["tp"] > 1 or sizes["cp"] > 1) and sizes["dp_replicate"] > 1 and sizes["dp_shard"] == 1:
        r.problems.append(f"{where}: {named}: tensor or context parallelism with dp_replicate_size above 1 needs "
                          "dp_shard_size above 1 (accelerate raises)")
    elif sizes["tp"] > 1 and sizes["dp_replicate"] > 1 and sizes["dp_shard"] * sizes["tp"] != gpus[1]:
        r.problems.append(f"{where}: {named}: replicas whose shard group is not a node's {gpus[1]} GPUs are not "
                          "modelled, so planner cannot give this job a verdict (planner's hybrid sharding shards "
                          "within a node and replicates across nodes)")


#: DeepSpeed sections planner reads but does not model (the output names them).
UNMODELLED_DEEPSPEED = {"compile": "DeepSpeed's torch.compile", "tensor_parallel": "DeepSpeed AutoTP tensor parallelism",
                        "sequence_parallel_size": "Ulysses sequence parallelism"}
#: accelerate's deepspeed_config keys it refuses beside deepspeed_config_file (accelerate
#: DeepSpeedPlugin._deepspeed_config_checks).
DEEPSPEED_FILE_IGNORES = frozenset({"gradient_accumulation_steps", "gradient_clipping", "zero_stage",
                                    "offload_optimizer_device", "offload_param_device", "offload_param_nvme_path",
                                    "offload_optimizer_nvme_path", "zero3_save_16bit_model"})


def _turned_on(value) -> bool:
    """A DeepSpeed section that is on: a mapping not ``enabled: false``, or a degree above 1."""
    if isinstance(value, dict):
        return value.get("enabled", True) not in (False, "false")
    return isinstance(value, int) and not isinstance(value, bool) and value > 1


def _accelerate_legacy(d: dict) -> dict:
    """The legacy keys accelerate converts as it loads a config (``BaseConfig.process_config``):
    ``fp16: true`` is mixed_precision fp16 (when none is given), ``dynamo_backend`` is
    ``dynamo_config``."""
    d = dict(d)
    if "fp16" in d:
        fp16 = d.pop("fp16")
        if "mixed_precision" not in d and fp16:
            d["mixed_precision"] = "fp16"
    if "dynamo_backend" in d:
        backend = d.pop("dynamo_backend")
        d.setdefault("dynamo_config", {} if str(backend).upper() == "NO" else {"dynamo_backend": backend})
    return d


def _add_fsdp(parts: dict, config: dict, where: str, r: Reading, accelerate: bool, options: tuple[str, ...]) -> None:
    """FSDP settings for the strategies, with their version: accelerate's ``fsdp_version`` (default
    1, accelerate FullyShardedDataParallelPlugin) or the Trainer's ``fsdp_config.version`` (default 2,
    transformers 5 ``TrainingArguments``)."""
    key, default = ("fsdp_version", 1) if accelerate else ("version", 2)
    version = config.get(key, default)
    if version not in (1, 2, "1", "2"):
        r.problems.append(f"{where}: FSDP version must be 1 or 2, not {version!r}")
        return
    source = f"{where}: {'' if accelerate else 'fsdp_config.'}{key}" if key in config else \
        f"{where}: no {key} ({'accelerate' if accelerate else 'the Trainer'}'s default, {default})"
    parts["fsdp"] = (*parts.get("fsdp", ()), FsdpSettings(where, config, accelerate, options, int(version), source))


def beside(path: Path, named: str) -> Path:
    """A file another file names: relative to that file's folder if it is there, else as given."""
    candidate = Path(named) if Path(named).is_absolute() else path.parent / named
    try:
        return candidate if candidate.exists() else Path(named)
    except (OSError, ValueError):  # unreadable or impossible names (e.g. a NUL byte) fail when read
        return Path(named)


def _deepspeed(d: dict, where: str, r: Reading) -> None:
    """The DeepSpeed JSON's own keys and its batch sizes. DeepSpeed ignores top-level keys it does
    not read (a warning here, with the closest key); its ZeRO section refuses unknown keys."""
    if named := _unknown(d, known_keys()["deepspeed_top"]):
        r.warnings.append(f"{where}: DeepSpeed reads no top-level key {named}: it is ignored")
    for key, what in UNMODELLED_DEEPSPEED.items():
        if _turned_on(d.get(key)):
            r.warnings.append(f"{where}: {key}: {what} is not modelled; its memory and speed are not counted")
    zero = r.section(d, "zero_optimization", where)
    _refuse_unknown(zero, known_keys()["deepspeed_zero"], f"{where}: zero_optimization", "DeepSpeed's ZeRO config", r)
    for key, field in (("train_micro_batch_size_per_gpu", "micro_batch_size"), ("gradient_accumulation_steps",
                                                                                "grad_accum")):
        if d.get(key) == "auto" and field not in r.values:
            r.warnings.append(f"{where}: {key} is \"auto\" (the Trainer fills it from its arguments) and no Trainer "
                              f"arguments set it: planned with the default or --{field.replace('_', '-')}")
    mbs = r.typed(d, "train_micro_batch_size_per_gpu", (int,), where, allow_auto=True)
    accum = r.typed(d, "gradient_accumulation_steps", (int,), where, allow_auto=True)
    total = r.typed(d, "train_batch_size", (int,), where, allow_auto=True)
    if mbs:
        r.set("micro_batch_size", mbs, f"{where}: train_micro_batch_size_per_gpu")
    if accum:
        r.set("grad_accum", accum, f"{where}: gradient_accumulation_steps")
    if total:
        r.train_batch = (total, f"{where}: train_batch_size")


def _training_args(path: Path, r: Reading, parts: dict, method: str | None = None) -> Path | dict | None:
    """Trainer arguments: their own keys, the workload, the FSDP settings for the strategies; returns
    the DeepSpeed config they name (a path or an inline dict)."""
    d = read_mapping(path, "training arguments")
    where = path.name
    framework = detect(d)
    if framework is None:
        problems, warnings = read_recipe_keys(d, known_keys()["training_args"], where, extra=SEQ_LEN_KEYS)
        refusal = trl_method(d, where, named=method)
        problems += [refusal] if refusal else []
        if isinstance(d.get("model_name_or_path"), str):
            r.model = (d["model_name_or_path"], f"{where}: model_name_or_path")
    else:  # a LLaMA-Factory or axolotl YAML, as the Trainer/TRL recipe it becomes
        problems, warnings = check_keys(framework, d, known_keys()["training_args"], where)
        t = translate(framework, d, where)
        problems, warnings, d, r.model = problems + t.problems, warnings + t.warnings, t.args, t.model
        parts |= {"framework": framework, "origins": {**parts.get("origins", {}), where: t.origins}}
    parts |= {"training_args": d, "training_args_where": where}
    r.problems += problems
    r.warnings += warnings
    mbs = r.typed(d, "per_device_train_batch_size", (int,), where)
    accum = r.typed(d, "gradient_accumulation_steps", (int,), where)
    if mbs is not None:
        r.set("micro_batch_size", mbs, f"{where}: per_device_train_batch_size")
    if accum is not None:
        r.set("grad_accum", accum, f"{where}: gradient_accumulation_steps")
    for key in SEQ_LEN_KEYS:
        seq = r.typed(d, key, (int,), where)
        if seq:
            r.set("seq_len", seq, f"{where}: {key}")
    _batching(d, where, r)
    if d.get("parallelism_config") is not None:
        # TrainingArguments.parallelism_config is accelerate's ParallelismConfig: parsed from a file it
        # stays a dict, which the Trainer hands to Accelerator (transformers 5.24, accelerate 1.15:
        # AttributeError 'dict' object has no attribute 'get_device_mesh')
        r.problems.append(f"{where}: parallelism_config in Trainer arguments read from a file stays a dict, which "
                          "accelerate's Accelerator cannot take (the run stops at start): put its sizes in the "
                          "accelerate config's parallelism_config block, which planner reads")
    if d.get("torch_compile"):
        r.warnings.append(f"{where}: torch_compile is not modelled")
    fsdp = d.get("fsdp")
    if fsdp:
        config = d.get("fsdp_config") or {}
        if isinstance(config, str):  # a JSON file's path, which TrainingArguments reads (json.load)
            config = read_mapping(beside(path, config), f"{where}: fsdp_config", hint="Give fsdp_config as a "
                                  "mapping, or the path of a JSON file of one.") if config.endswith(".json") else config
        if not isinstance(config, dict):
            r.problems.append(f"{where}: fsdp_config must be a mapping or the path of a .json file")
            config = {}
        # TrainingArguments drops the fsdp_ prefix of each key (transformers 5.23 training_args.py)
        config = {str(k).removeprefix("fsdp_"): v for k, v in config.items()}
        options = fsdp.split() if isinstance(fsdp, str) else (fsdp if isinstance(fsdp, list) else [])
        _add_fsdp(parts, config, where, r, accelerate=False, options=tuple(str(o) for o in options))
    ds = d.get("deepspeed")
    if ds is not None and not isinstance(ds, (str, dict)):
        r.problems.append(f"{where}: deepspeed must be a path or a mapping")
        return None
    if isinstance(ds, str):
        return beside(path, ds)
    return ds
