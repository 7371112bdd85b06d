"""torchtitan training TOMLs (``--job.config_file``), read as the configuration they run.

Facts at pytorch/torchtitan@7e4ab859 (2025-12-29, the TOML era's last release state; sections,
keys and the llama3 and dense qwen3 flavors ship in data/torchtitan.json with their source):
- the loader (config/manager.py ``_dict_to_dataclass``) refuses a key no section has ("Invalid
  field names"), since eadca483 (2025-08-28; earlier ones ignored it); ``job.custom_config_module``
  adds sections of one's own. Keys of the earlier TOML era (``training.batch_size``, ``[float8]``
  ...) are read with their meaning then, and said to be refused now.
- degrees (distributed/parallel_dims.py): ``dp_replicate x dp_shard x cp x tp x pp`` = the GPUs,
  ``data_parallel_shard_degree`` -1 the rest; FSDP2 (``fully_shard``) over ``dp_shard x cp`` when
  that is above 1, HSDP with ``dp_replicate`` above 1 too, composable DDP (``replicate``,
  ``bucket_cap_mb=100``) with ``dp_replicate`` alone, one plain GPU otherwise; the global batch
  ``local_batch_size x dp_replicate x dp_shard`` unless ``global_batch_size`` names a multiple of
  it, the quotient being the accumulation (train.py). FSDP reduces every micro-batch (no
  ``set_requires_gradient_sync``).
- precision (train.py, distributed/utils.py ``maybe_enable_amp``, llama3/infra/parallelize.py
  ``apply_fsdp``): the model is built in ``training.dtype`` (float32 by default: fp32 master
  weights); FSDP2 gathers it in ``mixed_precision_param`` and reduces in ``mixed_precision_reduce``
  (bfloat16 / float32 by default); without FSDP ``torch.autocast`` runs ``mixed_precision_param``.
  ``dtype = "bfloat16"`` keeps parameters, gradients and optimizer states in bf16 (bf16-pure).
  The ``float8`` converter (``quantize.linear.float8``; ``float8`` before 2025-09-26) swaps the
  linears for torchao's Float8Linear (fp8-mixed).
- activation checkpointing (distributed/activation_checkpoint.py): ``mode`` none / full /
  selective (the default) with ``selective_ac_option`` "op" (the per-op policy, planner's
  selective) or an integer N (every N-th block; "1" and "0" every block); non-reentrant
  ``checkpoint_wrapper``. ``memory_budget`` is compile's min-cut.
- the step (train.py ``forward_backward_step``): the model's bf16 logits are upcast and
  cross-entropy runs over the flattened fp32 copy (labels shifted by the data loader), ``pred``
  deleted before backward; the data loader packs documents into ``seq_len`` rows; SDPA attention.
Refused with the reason (not modelled): tensor parallelism (torchtitan's is sequence-parallel with
loss parallelism: norms and the residual stream split over the TP ranks, the logits split on the
vocabulary, which planner's tensor-parallel model, transformers' own, does not hold), pipeline and
expert parallelism, every-N-th-block and memory-budget checkpointing, the optimizer step in
backward, MX formats, HSDP whose shard group is not a node, flex / varlen attention flavors.
"""

import json
from difflib import get_close_matches
from functools import cache
from pathlib import Path

from planner.catalog import DATA_DIR
from planner.catalog.files import read_mapping
from planner.core.job import Reading
from planner.core.lengths import Batching

#: A TOML whose top-level tables include one of these is read as torchtitan's.
MARKERS = ("parallelism", "training", "activation_checkpoint")
#: Why a job this reader cannot plan is refused (the problems carry it).
UNMODELLED = "not modelled, so planner cannot give this job a verdict"
#: The values a torchtitan TOML can express, per field planner reads from it (the module docstring's
#: keys): check offers only changes within them.
EXPRESSIBLE = {
    "sharding": frozenset({"none", "ddp", "fsdp", "fsdp-grad-op", "fsdp-hybrid"}),
    "precision": frozenset({"fp32", "bf16-mixed", "bf16-pure", "fp8-mixed"}),
    "checkpointing": frozenset({"none", "selective", "full"}),
    "offload": frozenset({"none", "optimizer+params"}),
    "optimizer": frozenset({"adamw", "adamw-foreach"}),
    "sequence_parallel": frozenset({"none", "ring"}),
    **{name: frozenset({value}) for name, value in (
        ("loss", "standard"), ("attention", "sdpa"), ("adapter", "none"), ("tensor_parallel", "none"),
        ("tiled_mlp", "none"), ("checkpoint_offload", "none"), ("method", "sft"), ("generation", "none"),
        ("fsdp_version", 2), ("checkpoint_impl", "non-reentrant"), ("gradient_sync", "micro-batch"))},
}


@cache
def schema() -> dict:
    """data/torchtitan.json: ``sections`` (section -> keys; nested sections dotted), ``legacy``
    (keys of the earlier TOML era -> what became of them), ``flavors`` (name -> flavor -> the
    catalog model with the flavor's dimensions)."""
    return json.loads((DATA_DIR / "torchtitan.json").read_text())


def is_torchtitan(d: dict) -> bool:
    """Whether a TOML mapping is a torchtitan job config (a pyproject.toml is not)."""
    return any(isinstance(d.get(k), dict) for k in MARKERS) and "project" not in d and "build-system" not in d


class _Sections:
    """The TOML's tables, read with ``Reading.typed``: each value named "file: section.key" (as
    torchtitan's command line names it: ``--training.seq_len``)."""

    def __init__(self, d: dict, name: str, r: Reading):
        self.d, self.name, self.r = d, name, r

    def where(self, section: str, key: str | None = None) -> str:
        return f"{self.name}: {section}" + (f".{key}" if key else "")

    def table(self, section: str) -> dict:
        node: object = self.d
        for part in section.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node if isinstance(node, dict) else {}

    def get(self, section: str, key: str, kinds: tuple, default=None):
        return self.r.typed(self.table(section), key, kinds, self.where(section), default)

    def said(self, section: str, key: str) -> bool:
        return key in self.table(section)


def read_torchtitan(path: Path, r: Reading, gpus: int, per_node: int) -> None:
    """Read a torchtitan TOML at ``path`` into ``r`` for a job on ``gpus`` GPUs (``per_node`` a
    node): every field it decides, with the key (or torchtitan's default) it came from."""
    d = read_mapping(path, "torchtitan config")
    r.expressible, r.expressible_by = EXPRESSIBLE, "torchtitan"
    t = _Sections(d, path.name, r)
    _keys(d, t)
    if r.problems:
        return
    _model(t, r)
    replicate, shard, cp = _degrees(t, r, gpus, per_node)
    if r.problems:
        return
    _batch(t, r, replicate * shard)
    _precision(t, r, fsdp=shard * cp > 1)
    _checkpointing(t, r)
    _optimizer(t, r)
    _elsewhere(t, r)


def _keys(d: dict, t: _Sections) -> None:
    """Unknown sections and keys, as torchtitan's loader judges them (a problem, with "did you
    mean"; a warning where ``job.custom_config_module`` extends the schema); keys of the earlier
    TOML era are read, with a warning that today's loader refuses them."""
    sections, legacy = schema()["sections"], schema()["legacy"]
    custom = t.table("job").get("custom_config_module") or t.table("experimental").get("custom_args_module")
    top = [k for k in sections if "." not in k]

    def walk(node: dict, prefix: str) -> None:
        allowed = sections[prefix] if prefix else top
        for key, value in node.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            if key in allowed:
                if name in sections and isinstance(value, dict):
                    walk(value, name)
                elif name in sections:
                    t.r.problems.append(f"{t.name}: {name} must be a table of keys, not {value!r}"[:300])
                continue
            old = legacy.get(prefix, {}).get(key) if prefix else (key in legacy and next(iter(legacy[key].values())))
            here = t.where(prefix, str(key)[:80]) if prefix else f"{t.name}: section {str(key)[:80]}"
            if old:
                t.r.warnings.append(f"{here}: read as torchtitan read it before ({old}); torchtitan 2025-12 refuses it")
                continue
            close = get_close_matches(str(key), allowed, n=1)
            message = (f"{here}: torchtitan has no such {'key' if prefix else 'section'}"
                       + (f" (did you mean {close[0]}?)" if close else ""))
            if custom:
                t.r.warnings.append(f"{message}; job.custom_config_module may add it (not read)")
            else:
                t.r.problems.append(f"{message}: its loader refuses it (Invalid field names)")

    walk(d, "")


def _model(t: _Sections, r: Reading) -> None:
    """The catalog model of a llama3 or dense qwen3 flavor (its dimensions are the flavor's:
    tests/test_torchtitan.py); other models are --model's to name."""
    name = t.get("model", "name", (str,), "llama3")
    flavor = t.get("model", "flavor", (str,), "debugmodel")
    where = t.where("model", "flavor") if t.said("model", "flavor") else f"{t.name}: torchtitan's default flavor"
    if name is None or flavor is None:
        return
    if flavor.endswith(("_flex", "_varlen", "_flex_attn", "_varlen_attn")):
        r.problems.append(f"{where}: {flavor}: flex / variable-length attention is {UNMODELLED} (planner models SDPA)")
        return
    known = schema()["flavors"].get(name, {}).get(flavor)
    if known is not None:
        r.model = (known["model"], f"{where} {flavor} of {name} (the same dimensions)")


def _degrees(t: _Sections, r: Reading, gpus: int, per_node: int) -> tuple[int, int, int]:
    """(dp_replicate, dp_shard, cp) as torchtitan resolves them on ``gpus`` GPUs, and the sharding,
    sequence parallelism and offload they mean; tensor, pipeline and expert degrees refused."""
    section = "parallelism"
    degree = {key: t.get(section, f"{key}_degree", (int,), 1) for key in
              ("data_parallel_replicate", "tensor_parallel", "pipeline_parallel", "context_parallel",
               "expert_parallel")}
    raw_shard = t.table(section).get("data_parallel_shard_degree", -1)
    if not isinstance(raw_shard, int) or isinstance(raw_shard, bool) or raw_shard < -1 or raw_shard == 0:
        r.problems.append(f"{t.where(section, 'data_parallel_shard_degree')} = {raw_shard!r}: -1 (the rest) or a "
                          "positive integer")
        return 1, 1, 1
    if any(v is None or v < 1 for v in degree.values()):
        bad = [k for k, v in degree.items() if v is not None and v < 1]
        r.problems += [f"{t.where(section, k + '_degree')} must be 1 or more" for k in bad]
        return 1, 1, 1
    replicate, tp, pp, cp = (degree[k] for k in ("data_parallel_replicate", "tensor_parallel", "pipeline_parallel",
                                                 "context_parallel"))
    others = replicate * cp * tp * pp
    shard = raw_shard if raw_shard > 0 else gpus // others
    if shard < 1 or replicate * shard * cp * tp * pp != gpus:
        r.problems.append(f"{t.where(section)}: dp_replicate {replicate} x dp_shard "
                          f"{raw_shard if raw_shard > 0 else 'the rest'} x cp {cp} x tp {tp} x pp {pp} is not "
                          f"the {gpus} GPUs of --gpus: torchtitan refuses that (Invalid parallel dims)")
        return 1, 1, 1
    if tp > 1:
        r.problems.append(f"{t.where(section, 'tensor_parallel_degree')} {tp}: torchtitan's tensor parallelism is "
                          "sequence-parallel with loss parallelism (norms and the residual stream split over the TP "
                          f"ranks, the logits split on the vocabulary); {UNMODELLED} (planner's tensor-parallel model is "
                          "transformers' own)")
    if pp > 1:
        r.problems.append(f"{t.where(section, 'pipeline_parallel_degree')} {pp}: pipeline parallelism is {UNMODELLED}")
    if degree["expert_parallel"] > 1:
        r.problems.append(f"{t.where(section, 'expert_parallel_degree')} {degree['expert_parallel']}: expert "
                          f"parallelism is {UNMODELLED}")
    where = f"{t.where(section)}: dp_replicate {replicate}, dp_shard {shard}, cp {cp}"
    fsdp = shard * cp > 1
    if fsdp and replicate > 1:
        if shard * cp != per_node or replicate * per_node != gpus:
            r.problems.append(f"{where}: HSDP with a shard group of {shard * cp} GPUs, not a node's {per_node}: "
                              f"{UNMODELLED} (planner's hybrid sharding shards within a node, replicates across nodes)")
        r.set("sharding", "fsdp-hybrid", f"{where} (HSDP: fully_shard over a node, replicated across nodes)")
    elif fsdp:
        reshard = t.get(section, "fsdp_reshard_after_forward", (str,), "default")
        if reshard not in ("default", "always", "never"):
            r.problems.append(f"{t.where(section, 'fsdp_reshard_after_forward')} {reshard!r}: default, always or never")
        grad_op = reshard == "never"
        r.set("sharding", "fsdp-grad-op" if grad_op else "fsdp",
              f"{where} (fully_shard over {shard * cp} GPUs, reshard_after_forward {reshard})")
    elif replicate > 1:
        r.set("sharding", "ddp", f"{where} (replicate: composable DDP)")
        r.warnings.append(f"{where}: DDP's buckets are torchtitan's 100 MB (bucket_cap_mb=100); planner times DDP's "
                          "default 25 MiB buckets")
    else:
        r.set("sharding", "none", f"{where} (one GPU)")
    if fsdp:
        r.set("fsdp_version", 2, f"{where}: torchtitan shards with FSDP2 (fully_shard)")
    if fsdp or replicate > 1:
        r.set("gradient_sync", "micro-batch", f"{t.name}: torchtitan reduces the gradients every micro-batch")
    offload = t.get("training", "enable_cpu_offload", (bool,), False)
    if offload and not fsdp:
        r.problems.append(f"{t.where('training', 'enable_cpu_offload')}: CPU offload is FSDP's (CPUOffloadPolicy); "
                          "this job has no FSDP")
    r.set("offload", "optimizer+params" if offload else "none",
          t.where("training", "enable_cpu_offload") + (" (FSDP2 CPUOffloadPolicy)" if offload else " false")
          if t.said("training", "enable_cpu_offload") else f"{t.name}: no CPU offload (torchtitan's default)")
    if cp > 1:
        rotate = t.get(section, "context_parallel_rotate_method", (str,), "allgather")
        if rotate != "allgather":
            r.problems.append(f"{t.where(section, 'context_parallel_rotate_method')} {rotate!r}: planner models ring "
                              f"attention's allgather rotation only; {UNMODELLED}")
        r.set("sequence_parallel", "ring", f"{t.where(section, 'context_parallel_degree')} {cp} (torch context "
                                           f"parallelism, {rotate})")
        r.set("sp_size", cp, t.where(section, "context_parallel_degree"))
    else:
        r.set("sequence_parallel", "none", f"{t.where(section)}: context_parallel_degree 1")
    r.set("tensor_parallel", "none", f"{t.where(section)}: tensor_parallel_degree 1")
    return replicate, shard, cp


def _batch(t: _Sections, r: Reading, data_parallel: int) -> None:
    """Micro-batch, accumulation and sequence length; torchtitan's loader packs its rows."""
    section = "training"
    legacy = "batch_size" if not t.said(section, "local_batch_size") and t.said(section, "batch_size") else None
    key = legacy or "local_batch_size"
    local = t.get(section, key, (int,), 8)
    where = t.where(section, key) if t.said(section, key) else f"{t.name}: torchtitan's default local_batch_size 8"
    if local is not None:
        r.set("micro_batch_size", local, where)
        raw = t.table(section).get("global_batch_size", -1)
        if not isinstance(raw, int) or isinstance(raw, bool) or raw == 0 or raw < -1:
            r.problems.append(f"{t.where(section, 'global_batch_size')} = {raw!r}: -1 (one micro-batch a step) or a "
                              "positive integer")
            return
        total = raw if raw > 0 else None
        per_step = local * data_parallel
        if total is not None and total % per_step:
            r.problems.append(f"{t.where(section, 'global_batch_size')} {total} is not a multiple of local batch "
                              f"{local} x data-parallel degree {data_parallel}: torchtitan refuses that")
        elif total is not None:
            r.set("grad_accum", total // per_step, f"{t.where(section, 'global_batch_size')} {total} / (local batch "
                                                   f"{local} x data-parallel degree {data_parallel})")
        else:
            r.set("grad_accum", 1, f"{t.name}: no global_batch_size: one micro-batch a step")
    seq = t.get(section, "seq_len", (int,), 2048)
    if seq is not None:
        r.set("seq_len", seq, t.where(section, "seq_len") if t.said(section, "seq_len")
              else f"{t.name}: torchtitan's default seq_len 2048")
    r.set("batching", Batching.PACKED, f"{t.name}: torchtitan's data loader packs documents into seq_len rows")


def _precision(t: _Sections, r: Reading, fsdp: bool) -> None:
    section = "training"
    dtype = t.get(section, "dtype", (str,), "float32")
    param = t.get(section, "mixed_precision_param", (str,), "bfloat16")
    reduce = t.get(section, "mixed_precision_reduce", (str,), "float32")
    converters = t.get("model", "converters", (list,), []) or []
    if any(not isinstance(c, str) for c in converters):
        r.problems.append(f"{t.where('model', 'converters')} must be a list of names")
        return
    fp8 = [c for c in converters if c in ("float8", "quantize.linear.float8")]
    others = [c for c in converters if c not in fp8]
    if others:
        r.problems.append(f"{t.where('model', 'converters')} {', '.join(others)[:200]}: {UNMODELLED} (planner models the "
                          "float8 converter)")
        return
    if dtype not in ("float32", "bfloat16") or param not in ("float32", "bfloat16"):
        r.problems.append(f"{t.where(section)}: dtype {dtype!r} / mixed_precision_param {param!r}: float32 or bfloat16")
        return
    where = f"{t.where(section)}: dtype {dtype}, mixed_precision_param {param}"
    if dtype == "bfloat16":
        value = "bf16-pure"
        where += " (parameters, gradients and optimizer states in bf16)"
    elif param == "bfloat16":
        value = "fp8-mixed" if fp8 else "bf16-mixed"
        where += (" (FSDP2 gathers bf16 from fp32 shards)" if fsdp else " (torch.autocast)")
    else:
        value = "fp32"
    if fp8 and value != "fp8-mixed":
        r.problems.append(f"{t.where('model', 'converters')} float8 with {where}: {UNMODELLED} (planner models fp8 "
                          "matmuls over bf16-mixed)")
        return
    if fp8:
        where += f"; {t.where('model', 'converters')} {fp8[0]} (torchao Float8Linear)"
        for key in ("enable_fsdp_float8_all_gather",):
            block = "quantize.linear.float8" if t.table("quantize.linear.float8") else "float8"
            if t.get(block, key, (bool,), False):
                r.warnings.append(f"{t.where(block, key)}: FSDP gathers fp8 weights, which planner does not model: "
                                  "its gathered weights and all-gathers are counted in bf16 (more than the job holds)")
    r.set("precision", value, where)
    if fsdp and reduce != "float32":
        r.warnings.append(f"{t.where(section, 'mixed_precision_reduce')} {reduce}: planner counts FSDP2's gradient "
                          "reductions in fp32 (torchtitan's default), more than the job holds")


def _checkpointing(t: _Sections, r: Reading) -> None:
    section = "activation_checkpoint"
    mode = t.get(section, "mode", (str,), "selective")
    option = t.get(section, "selective_ac_option", (str,), "2")
    if mode is None or option is None:
        return
    where = t.where(section, "mode") if t.said(section, "mode") else f"{t.name}: torchtitan's default mode selective"
    if mode in ("none", "full"):
        r.set("checkpointing", mode, f"{where} {mode}")
    elif mode == "selective" and option == "op":
        r.set("checkpointing", "selective", f"{where} selective, selective_ac_option op (torchtitan's per-op policy)")
    elif mode == "selective" and option.isdigit() and int(option) <= 1:
        r.set("checkpointing", "full", f"{where} selective, selective_ac_option {option}: every block")
    elif mode == "selective" and option.isdigit():
        said = "" if t.said(section, "selective_ac_option") else " (torchtitan's default)"
        r.problems.append(f"{where} selective, selective_ac_option {option}{said}: checkpointing every "
                          f"{option} blocks (the others keep every activation) is {UNMODELLED}; mode full, none, "
                          "or selective_ac_option op")
        return
    elif mode == "selective":
        r.problems.append(f"{t.where(section, 'selective_ac_option')} {option!r}: 'op' or a positive integer "
                          "(torchtitan raises)")
        return
    elif mode == "memory_budget":
        r.problems.append(f"{where} memory_budget: compile's min-cut recomputation is {UNMODELLED}")
        return
    else:
        r.problems.append(f"{where} {mode!r}: none, selective, full or memory_budget")
        return
    r.set("checkpoint_impl", "non-reentrant", f"{t.name}: torchtitan's checkpoint_wrapper (non-reentrant)")


def _optimizer(t: _Sections, r: Reading) -> None:
    section = "optimizer"
    name = t.get(section, "name", (str,), "AdamW")
    impl = t.get(section, "implementation", (str,), "fused")
    if name is None or impl is None:
        return
    if name not in ("AdamW", "Adam"):
        r.problems.append(f"{t.where(section, 'name')} {name!r}: torchtitan builds Adam or AdamW (it raises otherwise)")
        return
    if impl not in ("fused", "foreach", "for-loop"):
        r.problems.append(f"{t.where(section, 'implementation')} {impl!r}: fused, foreach or for-loop")
        return
    if t.get(section, "early_step_in_backward", (bool,), False):
        r.problems.append(f"{t.where(section, 'early_step_in_backward')}: the optimizer step in backward (each "
                          f"gradient freed as it is applied) is {UNMODELLED}")
        return
    where = (t.where(section, "name") if t.said(section, "name") else f"{t.name}: torchtitan's default AdamW") + \
        f", implementation {impl}" + (" (Adam holds AdamW's states)" if name == "Adam" else "")
    r.set("optimizer", "adamw-foreach" if impl == "foreach" else "adamw", where)


def _elsewhere(t: _Sections, r: Reading) -> None:
    """What no other section decides: the step's loss and attention, and what is not modelled."""
    r.set("method", "sft", f"{t.name}: next-token cross-entropy over every token (torchtitan's training loop)")
    r.set("adapter", "none", f"{t.name}: torchtitan trains every parameter")
    r.set("attention", "sdpa", f"{t.name}: the flavor's SDPA attention")
    r.set("loss", "standard", f"{t.name}: cross-entropy over the upcast logits")
    r.set("loss_path", "pad-labels", f"{t.name}: the logits upcast to fp32, labels shifted by the data loader")
    r.set("model_output", "dropped", f"{t.name}: the step deletes the logits before backward")
    if t.get("compile", "enable", (bool,), False):
        r.warnings.append(f"{t.where('compile', 'enable')}: torch.compile is not modelled; its speed-up and memory "
                          "are not counted (planned as eager)")
    if t.get("validation", "enable", (bool,), False):
        rows = t.get("validation", "local_batch_size", (int,), 8)
        r.warnings.append(f"{t.where('validation', 'enable')}: validation is not planned (micro-batches of {rows} "
                          "rows between steps)")
    if t.get("fault_tolerance", "enable", (bool,), False):
        r.warnings.append(f"{t.where('fault_tolerance', 'enable')}: TorchFT's replica groups are not modelled; "
                          "planned as one replica's job")
