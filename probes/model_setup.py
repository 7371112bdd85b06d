"""Build what a plan trains, as the plan says: the transformers model in the plan's dtype, its
checkpointing, attention, loss, FSDP2 sharding and optimizer. Used by the traced probe."""

from functools import partial

import torch

from planner.core.vocabulary import TrainingConfig

MIXED = ("bf16-mixed", "fp8-mixed", "fp16-mixed")


def param_dtype(c: TrainingConfig):
    """bf16 weights for bf16-pure; fp32 master weights for mixed precision and fp32."""
    return torch.bfloat16 if c.precision == "bf16-pure" else torch.float32


def autocast_on(c: TrainingConfig) -> bool:
    """Autocast runs the matmuls in bf16 for the mixed precisions; FSDP2 casts parameters itself."""
    return c.precision in MIXED and not c.sharding.startswith("fsdp")


def build_config(config_json: dict, layers: int | None):
    import transformers

    cfg_dict = dict(config_json)
    if layers is not None:
        cfg_dict["n_layer" if cfg_dict.get("model_type") == "gpt2" else "num_hidden_layers"] = layers
    cfg = transformers.AutoConfig.for_model(**cfg_dict)
    cfg.use_cache = False
    return cfg


def build_model(cfg, c: TrainingConfig):
    import transformers

    return transformers.AutoModelForCausalLM.from_config(cfg, dtype=param_dtype(c), attn_implementation=c.attention)


def decoder_layers(model):
    body = model.get_decoder()
    return body.layers if hasattr(body, "layers") else body.h


def apply_checkpointing(model, c: TrainingConfig) -> None:
    """full: HF gradient checkpointing (non-reentrant), or per-layer torch checkpoint under FSDP (the
    emitted plan uses FSDP's own activation checkpointing there); selective: each decoder layer under
    a selective policy that saves matmul and attention-kernel outputs (torchtitan's op-level SAC)."""
    if c.checkpointing == "none":
        return
    if c.checkpointing == "full" and not c.sharding.startswith("fsdp"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    aten = torch.ops.aten
    save = {aten.mm.default, aten.addmm.default, aten.bmm.default}
    for name in ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_efficient_attention"):
        if hasattr(aten, name):
            save.add(getattr(aten, name).default)

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

    selective = c.checkpointing == "selective"
    for layer in decoder_layers(model):
        kw = {"context_fn": partial(create_selective_checkpoint_contexts, policy)} if selective else {}
        layer.forward = partial(checkpoint, layer.forward, use_reentrant=False, **kw)


def fake_process_group(world: int) -> None:
    """A fake process group of ``world`` ranks: collectives return at once; this process is rank 0."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)


def apply_fsdp(model, c: TrainingConfig, mesh) -> None:
    """FSDP2 ``fully_shard`` on every decoder layer, then the root (embeddings, final norm, head), as
    the emitted plan wraps it; bf16 compute with fp32 gradient reduction for the mixed precisions."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mixed = c.precision in MIXED
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed else MixedPrecisionPolicy()
    reshard = c.sharding != "fsdp-grad-op"
    # offload optimizer+params: the emitted fsdp_offload_params (parameters, gradients and the
    # optimizer step on the host)
    offload = CPUOffloadPolicy() if c.offload != "none" else OffloadPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard, offload_policy=offload)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard, offload_policy=offload)


def build_optimizer(name: str, model):
    """The torch optimizer the plan names, or None when it cannot run under fake tensors (its
    states are then computed from their layout)."""
    params = list(model.parameters())
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, fused=True)  # the emitted adamw_torch_fused
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-4)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=1e-4, relative_step=False, scale_parameter=False)
    return None


def computed_state_bytes(model, c: TrainingConfig) -> int:
    """Optimizer state bytes from the planner's state layouts, for optimizers fake mode cannot run."""
    from planner.cost import optimizer_states as S

    total = 0
    for p in model.parameters():
        n = p.numel()
        if c.optimizer in ("adamw-8bit", "paged-adamw-8bit"):
            total += S.blockwise_8bit_states(n, 2)
        elif c.optimizer == "lion-8bit":
            total += S.blockwise_8bit_states(n, 1)
        elif c.optimizer == "paged-adamw":
            total += S.full_states(n, 2, 4)
        elif c.optimizer == "lion":
            total += S.full_states(n, 1, 4)
        elif c.optimizer == "adam-mini":
            total += S.adam_mini_states(tuple(p.shape), p.element_size())
    return total


def gpu_attention_with_dropout():
    """A patch of ``scaled_dot_product_attention`` for fake tensors: with dropout the CPU dispatcher
    falls back to the math kernel (which saves the full attention matrix), while a GPU runs the
    flash kernel with dropout. Under fake tensors the CUDA flash op's shape function runs on CPU
    tensors, so calls with dropout go to it (to the memory-efficient kernel when a mask is given, as
    on a GPU); the rest keep the CPU flash kernel, which saves what
    the GPU flash kernel saves (q, k, v, out, fp32 log-sum-exp). Returns an undo function."""
    import torch.nn.functional as F

    original = F.scaled_dot_product_attention

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if dropout_p > 0 and query.shape[1] == key.shape[1]:
            if attn_mask is None:
                return torch.ops.aten._scaled_dot_product_flash_attention(
                    query, key, value, dropout_p, is_causal, False, scale=scale)[0]
            if attn_mask.dtype == torch.bool:  # as SDPA does: a boolean mask becomes an additive bias
                attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill_(~attn_mask, float("-inf"))
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                query, key, value, attn_mask, True, dropout_p, is_causal, scale=scale)[0]
        return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                        scale=scale, enable_gqa=enable_gqa)

    F.scaled_dot_product_attention = sdpa
    return lambda: setattr(F, "scaled_dot_product_attention", original)


def gpu_dropout():
    """A patch of ``dropout`` for fake tensors: on a CUDA tensor ``at::dropout`` runs the fused
    ``native_dropout`` kernel, which saves a boolean mask (1 byte per element); on a CPU tensor it
    multiplies by a noise tensor in the input's dtype, which autograd saves (2 or 4 bytes). Training
    calls go to ``native_dropout``, as on a GPU. Returns an undo function."""
    import torch.nn.functional as F

    original = F.dropout

    def dropout(input, p=0.5, training=True, inplace=False):
        if training and 0 < p < 1 and input.numel():
            out = torch.ops.aten.native_dropout(input, p, True)[0]
            return input.copy_(out) if inplace else out
        return original(input, p, training, inplace)

    F.dropout = dropout
    return lambda: setattr(F, "dropout", original)


def gpu_kernels():
    """The GPU kernels' allocations for fake tensors on the CPU: SDPA with dropout and dropout
    (``gpu_attention_with_dropout``, ``gpu_dropout``). Returns one undo function."""
    undo = [gpu_attention_with_dropout(), gpu_dropout()]
    return lambda: [u() for u in undo]
