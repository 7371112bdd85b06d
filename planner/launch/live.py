"""What a launch actually runs, read from its live objects after training, in the plan's vocabulary.

Each field is observed, not copied from the files: the optimizer's class and its state dtypes, the
parameters' dtype and accelerate's mixed precision (fp8 linears counted), the checkpoint wrappers
on the decoder layers, accelerate's distributed type with DeepSpeed's stage and offload devices or
FSDP2's reshard and offload policies or FSDP1's strategy, the loss the model's forward runs, the attention
implementation, and the shape of the batches the model saw.
"""

from planner.core.vocabulary import ROWS_PER_SAMPLE
from planner.runtime.model import decoder_layers
from planner.strategies import FIELDS
from planner.strategies.method import TRAINERS
from planner.strategies.optimizer import CHOICES
from planner.strategies.sharding import FSDP1_STRATEGIES


def _inner_optimizer(opt):
    """The optimizer under accelerate's and DeepSpeed's wrappers."""
    seen = 0
    while hasattr(opt, "optimizer") and opt.optimizer is not opt and seen < 5:
        opt, seen = opt.optimizer, seen + 1
    return opt


def _is(opt, impl) -> bool:
    """Whether the live optimizer is ``impl`` (strategies/optimizer.py ``Impl``). bitsandbytes names
    one class for 8 and 32 bits, paged or not (the Trainer builds AdamW with optim_bits=8): its
    algorithm from the class name, its state bits and its paging from the object. torch's
    optimizers: the class, and whether it runs the fused kernel (``defaults["fused"]``: adamw) or
    the foreach kernels (adamw-foreach)."""
    cls = type(opt)
    if impl.library == "bitsandbytes":
        return (cls.__module__.startswith("bitsandbytes") and impl.family in cls.__name__
                and getattr(getattr(opt, "args", None), "optim_bits", 32) == impl.bits
                and bool(getattr(opt, "is_paged", False)) == impl.paged)
    if impl.module == "torch.optim" and bool(getattr(opt, "defaults", {}).get("fused")) != (impl.call == "fused"):
        return False
    return cls.__module__.startswith(impl.module.split(".")[0]) and cls.__name__ == impl.cls


def optimizer_name(opt) -> str:
    """The vocabulary value of a live optimizer (its module and class where none matches)."""
    cls = type(opt)
    for value, choice in CHOICES.items():
        impls = (choice.impl, choice.fsdp2) if choice.fsdp2 is not None else (choice.impl,)
        if any(_is(opt, i) for i in impls) or any(
                cls.__module__.startswith(mod) and cls.__name__ == name for mod, name in choice.live):
            return str(value)
    return f"{cls.__module__}.{cls.__name__}"


def _optimizer(trainer) -> tuple[str, dict]:
    opt = _inner_optimizer(trainer.optimizer)
    cls = type(opt)
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for state in opt.state.values()
                     for t in state.values() if hasattr(t, "dtype") and getattr(t, "ndim", 0) > 0})
    return optimizer_name(opt), {"optimizer_class": f"{cls.__module__}.{cls.__name__}", "optimizer_state_dtypes": dtypes}


def _fsdp_state(module):
    get = getattr(module, "_get_fsdp_state", None)
    return get() if get is not None else None


def _layer_group(layer):
    """The FSDP2 parameter group of a decoder layer: its own, or (activation checkpointing wraps
    the layer first, and checkpoint offload wraps that) a wrapped module's."""
    module = layer
    while module is not None:
        state = _fsdp_state(module)
        if state is not None and state._fsdp_param_group is not None:
            return state._fsdp_param_group
        module = getattr(module, "_checkpoint_wrapped_module", None)
    return None


def _sharding_and_offload(trainer, model) -> tuple[str, str, dict]:
    from accelerate.utils import DistributedType

    acc, world = trainer.accelerator, trainer.args.world_size
    kind = acc.distributed_type
    if kind == DistributedType.DEEPSPEED:
        engine = trainer.model_wrapped
        param, optim = engine.zero_offload_param(), engine.zero_offload_optimizer()
        offload = "optimizer+params" if param else "optimizer" if optim else "none"
        return f"zero{engine.zero_optimization_stage()}", offload, {"deepspeed_stage": engine.zero_optimization_stage(),
                                                                    "offload_devices": [bool(optim), bool(param)]}
    root = _fsdp1_root(trainer) if kind == DistributedType.FSDP else None
    if root is not None:
        return _fsdp1(root, model)
    # (FSDP2 applied by accelerate, or by transformers at load: DistributedConfig, under tensor parallelism)
    if kind == DistributedType.FSDP or _fsdp2_at_load(model):
        from torch.distributed.fsdp import CPUOffloadPolicy

        from planner.runtime.model import decoder_layers

        # the plan shards every decoder layer as its own unit (gathered one at a time); a layer left
        # in the root's unit is gathered with the whole model
        layers = list(decoder_layers(model))
        units = [g for g in map(_layer_group, layers) if g is not None]
        group = units[0] if units else _fsdp_state(model)._fsdp_param_group  # (the root's reshard policy differs)
        reshard = group.post_forward_mesh_info is not None
        mesh = group.mesh_info.mesh
        sharding = "fsdp-hybrid" if mesh.ndim == 2 else "fsdp" if reshard else "fsdp-grad-op"
        if len(units) != len(layers):
            sharding += f" ({len(units)} of {len(layers)} decoder layers sharded as their own units)"
        offload = "optimizer+params" if isinstance(group.offload_policy, CPUOffloadPolicy) else "none"
        policy = group.mp_policy
        return sharding, offload, {"fsdp_version": 2, "fsdp_reshard_after_forward": reshard, "fsdp_mesh": list(mesh.shape),
                                   "fsdp_decoder_layer_units": len(units),
                                   "fsdp_param_dtype": str(policy.param_dtype).removeprefix("torch."),
                                   "fsdp_reduce_dtype": str(policy.reduce_dtype).removeprefix("torch.")}
    return ("ddp" if world > 1 else "none"), "none", {"distributed_type": str(kind)}


def _fsdp2_at_load(model) -> bool:
    """Whether transformers sharded ``model`` with FSDP2 when it loaded it (``DistributedConfig``)."""
    from torch.distributed.fsdp import FSDPModule

    return bool(getattr(model, "is_distributed_loading_by_transformers", False)) and isinstance(model, FSDPModule)


def _tensor_parallel(model) -> tuple[dict, dict]:
    """The model's tensor parallelism, as transformers loaded it (its ``_tp_size``), and the
    placements of the first decoder layer's projections (each a DTensor split on the TP mesh)."""
    from torch.distributed.tensor import DTensor

    from planner.runtime.model import decoder_layers

    size = getattr(model, "_tp_size", None) or 1
    if size == 1:
        return {"tensor_parallel": "none"}, {}
    first = decoder_layers(model)[0]
    placements = {n: [str(p) for p in w.placements] for n, w in first.named_parameters()
                  if n.endswith(("q_proj.weight", "o_proj.weight")) and isinstance(w, DTensor)}
    return {"tensor_parallel": "transformers", "tp_size": size}, {"tp_placements": placements}


def _fsdp1_root(trainer):
    """The FSDP1 ``FullyShardedDataParallel`` root the Trainer wraps the model in, or None."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    wrapped = trainer.model_wrapped
    return wrapped if isinstance(wrapped, FullyShardedDataParallel) else None


#: FSDP1 ShardingStrategy names -> vocabulary (the emitted ones, and NO_SHARD: FSDP1 on one rank).
FSDP1_MODES = {name: str(mode) for mode, name in FSDP1_STRATEGIES.items()} | {"NO_SHARD": "ddp"}


def _fsdp1(root, model) -> tuple[str, str, dict]:
    """FSDP1: the root's sharding strategy, CPU offload and the decoder layers wrapped as their own
    units (an FSDP1 module whose wrapped module is the layer, under checkpoint wrappers too)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    layers = list(decoder_layers(model))  # (each the FSDP module wrapping it, when wrapped)
    units = sum(1 for x in layers if isinstance(x, FullyShardedDataParallel)
                or isinstance(getattr(x, "_checkpoint_wrapped_module", None), FullyShardedDataParallel))
    sharding = FSDP1_MODES.get(root.sharding_strategy.name, root.sharding_strategy.name)
    if units != len(layers):
        sharding += f" ({units} of {len(layers)} decoder layers sharded as their own units)"
    offload = "optimizer+params" if root.cpu_offload.offload_params else "none"
    return sharding, offload, {"fsdp_version": 1, "fsdp_sharding_strategy": root.sharding_strategy.name,
                               "fsdp_decoder_layer_units": units}


def _precision(trainer, model, sharding: str) -> tuple[str, dict]:
    params = [p for p in model.parameters() if p.requires_grad] or list(model.parameters())  # (an adapter's)
    # (FSDP2: the DTensor's local shard; ZeRO-3: the partition DeepSpeed keeps, ds_tensor)
    local = getattr(params[0], "_local_tensor", getattr(params[0], "ds_tensor", params[0]))
    dtype = str(local.dtype).removeprefix("torch.")
    fp8 = sum(any(c.__name__ == "Float8Linear" for c in type(m).__mro__) for m in model.modules())
    mp = str(trainer.accelerator.mixed_precision)
    detail = {"parameter_dtype": dtype, "mixed_precision": mp, "float8_linears": fp8}
    if sharding.startswith("zero"):
        engine = trainer.model_wrapped
        name = "bf16-mixed" if engine.bfloat16_enabled() else "fp16-mixed" if engine.fp16_enabled() else "fp32"
        # DeepSpeed's mixed precision trains 16-bit parameters (fp32 masters in its optimizer)
        sixteen = {"bf16-mixed": "bfloat16", "fp16-mixed": "float16"}.get(name, dtype)
        return (name if dtype == sixteen else f"{name} over {dtype} parameters"), detail
    if mp == "fp8" and fp8:
        return "fp8-mixed", detail
    if mp in ("bf16", "fp16"):
        return (f"{mp}-mixed" if dtype == "float32" else f"{mp} autocast over {dtype} weights"), detail
    return {"bfloat16": "bf16-pure", "float32": "fp32"}.get(dtype, dtype), detail


def _checkpointing(model) -> tuple[str, dict]:
    layers = list(decoder_layers(model))
    policies = {getattr(layer, "_planner_checkpointing", None) for layer in layers}
    if "selective" in policies:
        saved = layers[0]._planner_saved_ops  # ops whose outputs the first layer's forward saved, per forward
        calls = max(1, saved.get("calls", 0))
        per_call = {op: n / calls for op, n in sorted(saved.items()) if op != "calls"}
        return ("selective" if policies == {"selective"} else "mixed"), {"selective_saved_ops_per_layer_forward": per_call}
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    wrapped = sum(isinstance(m, CheckpointWrapper) for m in model.modules())  # (FSDP2 renames the classes it shards)
    if wrapped or getattr(model, "is_gradient_checkpointing", False):
        return "full", {"checkpoint_wrappers": wrapped,
                        "hf_gradient_checkpointing": bool(getattr(model, "is_gradient_checkpointing", False))}
    return "none", {}


def _checkpoint_offload(model) -> tuple[str, dict]:
    """Whether the checkpointed layers' inputs go to host RAM: torch's ``OffloadWrapper`` (accelerate's
    FSDP ``activation_checkpointing_offload``) or transformers' checkpoint function under
    ``save_on_cpu`` (its ``offload``)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import OffloadWrapper

    wrappers = sum(isinstance(m, OffloadWrapper) for m in model.modules())
    functions = {getattr(layer, "_gradient_checkpointing_func", None) for layer in decoder_layers(model)}
    hf = sum("save_on_cpu" in getattr(getattr(getattr(f, "func", f), "__code__", None), "co_names", ())
             for f in functions if f is not None)
    return ("host" if wrappers or hf else "none"), {"offload_wrappers": wrappers, "hf_checkpoint_offload": bool(hf)}


def _tiled_mlp(model) -> tuple[str, dict]:
    """Whether every decoder layer's MLP runs through DeepSpeed's TiledMLP (the mark
    planner.runtime.tiled_mlp leaves on each module it patches): tiled, none, or mixed."""
    from planner.runtime.tiled_mlp import MARK

    layers = decoder_layers(model)
    marked = sum(hasattr(layer.mlp, MARK) for layer in layers)
    return ("tiled" if marked == len(layers) else "none" if not marked else "mixed"), {"tiled_mlp_layers": marked}


def _adapter(model) -> dict:
    """The peft adapter on the live model, in the plan's vocabulary (none without one)."""
    configs = getattr(model, "peft_config", None)
    if not configs:
        return {"adapter": "none"}
    lora = next(iter(configs.values()))
    wrapped = [n for n, m in model.named_modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")]
    four_bit = any(type(m).__name__ == "Linear4bit" for m in model.modules())
    eight_bit = any(type(m).__name__ == "Linear8bitLt" for m in model.modules())
    kind = "dora" if lora.use_dora else "qlora" if four_bit else "lora-int8" if eight_bit else "lora"
    targets = _target_set(wrapped)
    # (ZeRO-3 partitions parameters: ds_numel is the whole tensor's)
    trainable = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters() if p.requires_grad)
    prep = {"kbit_prep": _kbit_prep(model)} if kind == "qlora" else {}
    return {"adapter": kind, "lora_rank": lora.r, "lora_targets": targets, "lora_alpha": lora.lora_alpha,
            "lora_dropout": lora.lora_dropout, **prep, "details": {"adapter_wrapped_modules": len(wrapped),
                                                          "trainable_parameters": trainable, "nf4_linears": four_bit,
                                                          "int8_linears": eight_bit}}


def _kbit_prep(model) -> str:
    """How the live 4-bit base was prepared, in the plan's vocabulary: its norms' weights in fp32
    (peft's prepare_model_for_kbit_training) with the input embeddings fp32 too (``fp32``) or 16-bit
    (``fp32-norms``), else ``none``."""
    import torch

    norms = [p for n, p in model.named_parameters() if "norm" in n and not p.requires_grad]
    if not norms or any(p.dtype != torch.float32 for p in norms):
        return "none"
    return "fp32" if model.get_input_embeddings().weight.dtype == torch.float32 else "fp32-norms"


def _target_set(wrapped: list[str]) -> str:
    """The plan's LoRA target set that the names of the modules peft wrapped make up."""
    if wrapped and all(n.endswith((".q_proj", ".v_proj")) for n in wrapped):
        return "qv"
    if wrapped and all(".mlp." in n for n in wrapped):
        return "mlp"
    return "attention" if all(".attn." in n or ".self_attn." in n for n in wrapped) else "all-linear"


def _forwards(model):
    """Every function the model's forward reaches through wrappers: the class's, the bound one, and
    what each wraps. accelerate's mixed precision replaces ``model.forward`` with
    ``convert_outputs_to_fp32(autocast(forward))``, each layer keeping the one below in
    ``__wrapped__`` (``ConvertOutputsToFp32`` in ``model_forward``), and keeps the forward it wrapped
    in ``model._original_forward`` (accelerate ``Accelerator.prepare_model``)."""
    todo = [type(model).forward, model.forward, model.__dict__.get("_original_forward")]
    seen = []
    while todo:
        fn = todo.pop()
        fn = getattr(fn, "__func__", fn)
        if fn is None or any(fn is s for s in seen):
            continue
        seen.append(fn)
        todo += [getattr(fn, "__wrapped__", None), getattr(fn, "model_forward", None)]
    return seen


def _loss(model) -> str:
    """chunked when a forward the model runs is Liger's: its class's (Liger's patch of the class) or
    the one Liger binds to the instance (``_apply_liger_kernel_to_instance``, what the Trainer's
    ``use_liger_kernel`` calls: ``model.forward = MethodType(lce_forward, model)``), under any
    wrapper accelerate adds; the function's module is Liger's."""
    return "chunked" if any("liger" in (getattr(f, "__module__", None) or "") for f in _forwards(model)) else "standard"


def _batching(trainer, session, width: int | None) -> tuple[str, int | None]:
    """How the running Trainer batches (its collator: planner/launch/data.py ``Padded``, else
    packed rows of one length) and its rows' length: the first batch's width, or under padding
    to the longest, the length the samples were truncated to when that batch fit under it."""
    from planner.core.lengths import Batching
    from planner.launch.data import Padded

    collator = trainer.data_collator
    collator = getattr(collator, "data_collator", collator)  # (the Trainer's column-removing wrapper)
    collator = getattr(collator, "collator", collator)  # (data.py WithPositions: a split sequence's positions)
    if type(collator).__name__ in ("DataCollatorForPreference", "DataCollatorForUnpairedPreference"):  # TRL's:
        # DPO's and KTO's pad each batch to its longest
        return str(Batching.PADDED), width
    if _method(trainer) == "grpo":  # prompts padded left, completions right, to the micro-batch's longest
        cap = session.config.seq_len
        return str(Batching.PADDED), cap if width is not None and width <= cap else width
    if not isinstance(collator, Padded):
        return str(Batching.PACKED), width
    if collator.length is not None:
        return str(Batching.PADDED_MAX), width
    cap = session.config.seq_len
    return str(Batching.PADDED), cap if width is not None and width <= cap else width


def _method(trainer) -> str:
    """The training method the live trainer runs: TRL's DPOTrainer (or a subclass of it) is dpo,
    its GRPOTrainer grpo, its KTOTrainer kto (``method.TRAINERS``), any other Trainer sft."""
    names = {c.__name__ for c in type(trainer).__mro__}
    return next((method for method, cls in TRAINERS.items() if cls in names), "sft")


def _grpo(trainer) -> tuple[dict, dict]:
    """A GRPO run's generation (transformers, or vLLM colocated, asleep, or a server) and group,
    completion length and beta, as the running trainer holds them; whether it holds a reference
    model."""
    if _method(trainer) != "grpo":
        return {"generation": "none"}, {}
    args = trainer.args
    if not trainer.use_vllm:
        generation = "transformers"
    elif args.vllm_mode == "server":
        generation = "vllm-server"
    else:
        generation = "vllm-colocate-sleep" if args.vllm_enable_sleep_mode else "vllm-colocate"
    live = {"generation": generation, "num_generations": trainer.num_generations,
            "completion_len": trainer.max_completion_length, "kl_beta": trainer.beta,
            "generation_batch_size": args.generation_batch_size, "num_iterations": trainer.num_iterations}
    if generation in ("vllm-colocate", "vllm-colocate-sleep"):
        live["vllm_share"] = args.vllm_gpu_memory_utilization
    return live, {"reference_model": trainer.ref_model is not None,
                  "generation_batch_size": args.generation_batch_size, "steps_per_generation": args.steps_per_generation}


def _dpo(trainer) -> tuple[dict, dict]:
    """A DPO or KTO run's reference (``dpo_reference``: precomputed log-probabilities or a
    reference forward), KTO's loss, and whether it holds a reference model (none with an adapter
    or precomputed)."""
    method = _method(trainer)
    if method not in ("dpo", "kto"):
        return {}, {}
    live = {"dpo_reference": "precomputed" if trainer.precompute_ref_logps else "model"}
    if method == "kto":
        live["kto_loss"] = trainer.loss_type.replace("_", "-")
    return live, {"reference_model": trainer.ref_model is not None}


def _sequence_parallel(trainer) -> dict:
    """The run's sequence parallelism, as its accelerator holds it (accelerate's ParallelismConfig:
    sp_size above 1 is DeepSpeed's Ulysses, its only sp_backend; cp_size above 1 torch's ring
    attention, its only cp_backend)."""
    pc = getattr(getattr(trainer, "accelerator", None), "parallelism_config", None)
    sp, cp = getattr(pc, "sp_size", 1) or 1, getattr(pc, "cp_size", 1) or 1
    if sp > 1:
        return {"sequence_parallel": "ulysses", "sp_size": sp}
    return {"sequence_parallel": "ring", "sp_size": cp} if cp > 1 else {"sequence_parallel": "none"}


def observe(trainer, session) -> dict:
    """The live configuration: one value per TrainingConfig field, and the facts behind them."""
    model = trainer.accelerator.unwrap_model(trainer.model_wrapped) if hasattr(trainer, "accelerator") else trainer.model
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    optimizer, opt_detail = _optimizer(trainer)
    sharding, offload, shard_detail = _sharding_and_offload(trainer, model)
    precision, prec_detail = _precision(trainer, model, sharding)
    checkpointing, ckpt_detail = _checkpointing(model)
    checkpoint_offload, offload_detail = _checkpoint_offload(model)
    tiled_mlp, tiled_detail = _tiled_mlp(model)
    tensor, tensor_detail = _tensor_parallel(model)
    loss = _loss(model)
    shape = getattr(session, "batch_shape", None) or (None, None)
    sequence = _sequence_parallel(trainer)  # (a split sequence: a rank's rows hold 1/sp_size of each one's positions)
    shards = sequence.get("sp_size", 1)
    batching, rows = _batching(trainer, session, shape[1] * shards if shape[1] is not None else None)
    accum = (trainer.model_wrapped.gradient_accumulation_steps() if sharding.startswith("zero")
             else trainer.args.gradient_accumulation_steps)
    adapter = _adapter(model)
    adapter_detail = adapter.pop("details", {})
    fsdp = {"fsdp_version": shard_detail["fsdp_version"]} if "fsdp_version" in shard_detail else {}  # FSDP runs only
    if fsdp and accum > 1:  # the Trainer reduces every micro-batch only under accelerate's sync_each_batch
        each = trainer.accelerator.gradient_state.plugin_kwargs.get("sync_each_batch", False)
        fsdp["gradient_sync"] = "micro-batch" if each else "step"
    live = {
        "optimizer": optimizer, "precision": precision, "checkpointing": checkpointing,
        "checkpoint_offload": checkpoint_offload, "tiled_mlp": tiled_mlp, "sharding": sharding,
        "offload": offload, "loss": loss, "attention": model.config._attn_implementation, "method": _method(trainer),
        "micro_batch_size": shape[0] // ROWS_PER_SAMPLE.get(_method(trainer), 1) if shape[0] else shape[0],
        "grad_accum": accum, "seq_len": rows, "batching": batching,
    } | adapter | fsdp
    dpo, dpo_detail = _dpo(trainer)
    grpo, grpo_detail = _grpo(trainer)
    live |= dpo | grpo | sequence | tensor
    sequence_detail = {"positions_per_rank": shape[1]} if shards > 1 else {}
    assert set(FIELDS) | {"micro_batch_size", "grad_accum", "seq_len"} <= set(live)
    return live | {"details": opt_detail | shard_detail | prec_detail | ckpt_detail | offload_detail | tiled_detail
                   | adapter_detail | dpo_detail | grpo_detail | sequence_detail | tensor_detail
                   | {"compiled": trainer.args.torch_compile}}


def differences(config, live: dict) -> list[str]:
    """Every field where the live run is not the plan (a technique's settings where the run has
    them: LoRA's rank, ... exist only when an adapter trains)."""
    return [f"{name}: planned {getattr(config, name)}, running {live[name]}"
            for name in type(config).model_fields if name in live and str(getattr(config, name)) != str(live[name])]
