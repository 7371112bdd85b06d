"""What only the probes need around the runtime's model (planner/runtime/): a fake process group
(Ulysses' attention and transformers' tensor-parallel plan over it),
optimizer states computed where fake tensors cannot run the optimizer, and the GPU kernels'
allocations stood in for on the CPU. The model, its checkpointing, attention, loss, FSDP2 wrapping
and optimizer are the runtime's, as every user of a plan applies them."""

import collections

import torch


def fake_process_group(world: int) -> None:
    """A fake process group of ``world`` ranks: collectives return at once; this process is rank 0."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)


def tensor_parallel_mesh(config, world: int):
    """The plan's ``DistributedConfig`` over ``world`` ranks (planner/runtime/tensor_parallel.py) and
    transformers' device meshes of it (``initialize_distributed_mesh``, as ``from_pretrained``
    builds them), over the fake process group of ``world`` ranks (``fake_process_group`` first).
    Call it outside fake mode: a mesh holds a real rank tensor."""
    from transformers.distributed.utils import initialize_distributed_mesh

    from planner.runtime.tensor_parallel import distributed_config

    dc = distributed_config(config, world, world)
    return dc, initialize_distributed_mesh(dc)[1]


def distributed_model(cfg, config, meshes):
    """The model as ``from_pretrained(distributed_config=...)`` builds it before loading weights:
    built untied (``no_tie_weights``), transformers' ``maybe_distribute_model`` (the family's
    tensor-parallel plan on the tp mesh, then its FSDP2 units: the embeddings, each layer, the final
    norm with the head kept gathered, the root), then tied. ``meshes``: ``tensor_parallel_mesh``'s.
    FSDP2's sharding spec of a tensor-parallel parameter concatenates the two meshes, which reads
    a real tensor: that call runs outside fake mode while the patch holds. Returns the model and
    the undo of the patch."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh
    from transformers.initialization import no_tie_weights

    from planner.runtime.model import build_model

    original = DeviceMesh.__dict__["_concatenate"]
    concatenate = DeviceMesh._concatenate

    def outside_fake_mode(*args, **kwargs):
        with unset_fake_temporarily():
            return concatenate(*args, **kwargs)

    DeviceMesh._concatenate = staticmethod(outside_fake_mode)

    def undo():
        DeviceMesh._concatenate = original

    dc, manager = meshes
    try:
        with no_tie_weights():
            model = build_model(cfg, config)
        model = type(model).maybe_distribute_model(model, dc, manager)
        model.tie_weights()
    except BaseException:
        undo()
        raise
    return model, undo


def ulysses_attention(model, config):
    """DeepSpeed's Ulysses attention on ``model`` as accelerate registers it for a Trainer run
    (``UlyssesSPAttentionHF.register_with_transformers``: transformers' attention function of the
    model's implementation replaced by the wrapper that exchanges q, k, v and the output) over the
    fake process group of ``config.sp_size`` ranks (``fake_process_group`` first), deepspeed.comm
    bound to it. Under fake tensors the exchange is its registered fake (an empty tensor of the
    input's shape, as the real one allocates). Returns the undo (the attention function and
    DeepSpeed's sequence-parallel groups)."""
    import importlib

    import deepspeed.comm as dcomm
    from deepspeed.runtime.sequence_parallel import parallel_state_sp as mpu
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    # (the fake group needs no shared-memory collective: DeepSpeed's own answer where the op is
    # unavailable, None, so nothing is compiled on a machine without a GPU)
    dcomm_torch = importlib.import_module("deepspeed.comm.torch")  # (``deepspeed.comm.torch`` the attribute is torch)
    build, dcomm_torch.build_shm_op = dcomm_torch.build_shm_op, lambda: None
    try:
        dcomm.init_distributed(dist_backend="fake", auto_mpi_discovery=False, verbose=False)
    finally:
        dcomm_torch.build_shm_op = build
    impl = model.config._attn_implementation
    before = ALL_ATTENTION_FUNCTIONS[impl]
    UlyssesSPAttentionHF.register_with_transformers(model, impl, config.sp_size, config.micro_batch_size,
                                                    seq_length_is_variable=True)

    def undo() -> None:
        ALL_ATTENTION_FUNCTIONS[impl] = before
        mpu._release_sequence_parallel_groups()

    return undo


def computed_state_bytes(model, c) -> tuple[int, int]:
    """(on the GPU, paged) optimizer state bytes of ``model``'s trainable parameters from the
    optimizer's own state rule (strategies/optimizer.py ``CHOICES``), for implementations fake
    mode cannot run. Paged state is only that of tensors bitsandbytes pages (at least
    ``BNB_PAGED_MIN_NUMEL`` elements); the rest stays on the GPU."""
    from planner.cost.optimizer_states import BNB_PAGED_MIN_NUMEL
    from planner.strategies.optimizer import CHOICES

    choice = CHOICES[c.optimizer]
    dense = paged = 0
    for p in model.parameters():
        if not p.requires_grad:  # (an adapter's frozen base has no state)
            continue
        b = choice.states(p.numel(), tuple(p.shape), p.element_size())
        if choice.paged and p.numel() >= BNB_PAGED_MIN_NUMEL:
            paged += b
        else:
            dense += b
    return dense, paged


def computed_step_temporaries(model, c) -> int:
    """The step's temporaries of an optimizer fake mode does not run as CUDA does, from the same
    rule as the analytic ledger (planner/cost/optimizer_states.py): one that updates one tensor
    at a time (``OptimizerChoice.step_temporaries``: Adam-mini, ``per_tensor_step_temporary``), or
    torch's foreach AdamW (``foreach_step_temporary``, measured on the real CPU allocator); 0 for
    the others."""
    from planner.cost.optimizer_states import foreach_step_temporary, per_tensor_step_temporary
    from planner.strategies.optimizer import CHOICES

    choice = CHOICES[c.optimizer]
    if choice.foreach:
        return foreach_step_temporary(computed_state_bytes(model, c)[0])
    if not choice.step_temporaries:
        return 0
    return per_tensor_step_temporary(max(p.numel() for p in model.parameters() if p.requires_grad))


def nf4_saving_bytes(model) -> int:
    """Bytes QLoRA's 4-bit load saves on a model traced over its 16-bit base: each linear it
    quantizes (planner.runtime.adapter.frozen_linears) in its dtype less its NF4 bytes with double
    quantization (planner.cost.adapters.nf4_bytes)."""
    from planner.cost.adapters import nf4_bytes
    from planner.runtime.adapter import frozen_linears

    return sum(w.numel() * w.element_size() - nf4_bytes(w.numel(), True)
               for _, _, child in frozen_linears(model) for w in [child.weight])


def bnb_lora_casts():
    """Make peft's LoRA layers over the 16-bit base the trace uses for QLoRA cast their input as
    peft's bitsandbytes layers do (``tuners/lora/bnb.py``: only without CUDA's autocast, where the
    adapters are in the activations' dtype, so never a copy; planner.cost.adapters
    ``casts_adapter_input``): under the trace's CPU autocast the plain layer would cast to the
    fp32 adapters' dtype and save that copy. Returns the undo function."""
    from peft.tuners.lora.layer import LoraLayer

    original = LoraLayer._cast_input_dtype

    def cast(self, x, dtype):
        return x if torch.is_autocast_enabled(x.device.type) else original(self, x, dtype)

    LoraLayer._cast_input_dtype = cast
    return lambda: setattr(LoraLayer, "_cast_input_dtype", original)


def peft_on_fake_tensors():
    """Patches for wrapping and tracing a peft model on fake tensors. Returns one undo function.

    - peft moves each new adapter to its base layer's device and dtype with ``Module.to``, which on
      fake parameters swaps tensors (``swap_tensors``) and fails (the fake mode holds a weak
      reference to each); the patch casts each adapter parameter's ``.data`` instead: the same
      dtype, on the same (CPU) device; and a ``Module.to`` that changes nothing returns at once.
    - torch's MemTracker installs gradient hooks on every parameter of the modules it tracks, and
      torch refuses a hook on a frozen one (an adapter's base); the patch gives frozen parameters
      an empty handle, as they never get a gradient to report."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    from torch.utils.hooks import RemovableHandle

    original_move = BaseTunerLayer._move_adapter_to_device_of_base_layer

    def move(self, adapter_name, device=None):
        _, dtype = self._get_base_layer_device_and_dtype(self.get_base_layer())
        for layer_name in self.adapter_layer_names + self.other_param_names:
            layer = getattr(self, layer_name, None)
            if isinstance(layer, (torch.nn.ModuleDict, torch.nn.ParameterDict)) and adapter_name in layer:
                for p in ([layer[adapter_name]] if isinstance(layer, torch.nn.ParameterDict)
                          else layer[adapter_name].parameters()):
                    if dtype is not None and dtype.is_floating_point:
                        p.data = p.data.to(dtype)

    hooks = {name: getattr(torch.Tensor, name) for name in ("register_hook", "register_post_accumulate_grad_hook")}
    no_hooks = collections.OrderedDict()  # (RemovableHandle keeps a weak reference to its hooks' dict)

    def frozen_aware(name):
        def register(self, hook):
            if isinstance(self, torch.nn.Parameter) and not self.requires_grad:
                return RemovableHandle(no_hooks)
            return hooks[name](self, hook)
        return register

    original_to = torch.nn.Module.to

    def to(self, *args, **kwargs):  # peft's same-device moves: nothing to do on fake CPU tensors
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        tensors = list(self.parameters()) + list(self.buffers())
        if all((device is None or t.device == torch.device(device)) and (dtype is None or t.dtype == dtype)
               for t in tensors):
            return self
        return original_to(self, *args, **kwargs)

    BaseTunerLayer._move_adapter_to_device_of_base_layer = move
    torch.nn.Module.to = to
    for name in hooks:
        setattr(torch.Tensor, name, frozen_aware(name))

    def undo():
        BaseTunerLayer._move_adapter_to_device_of_base_layer = original_move
        torch.nn.Module.to = original_to
        for name, fn in hooks.items():
            setattr(torch.Tensor, name, fn)

    return undo


def gpu_attention_with_dropout():
    """A patch of ``scaled_dot_product_attention`` for fake tensors: with dropout the CPU dispatcher
    falls back to the math kernel (which saves the full attention matrix), while a GPU runs the
    flash kernel with dropout. Under fake tensors the CUDA flash op's shape function runs on CPU
    tensors, so calls with dropout go to it (to the memory-efficient kernel when a mask is given, as
    on a GPU); the rest keep the CPU flash kernel, which saves what
    the GPU flash kernel saves (q, k, v, out, fp32 log-sum-exp). Grouped k/v (``enable_gqa``, which
    transformers passes only without a mask: integrations/sdpa_attention.py ``use_gqa_in_sdpa``) go
    to the flash kernel as they are: CUDA's flash kernel takes fewer k/v heads than query heads (torch
    aten/src/ATen/native/transformers/cuda/sdp_utils.cpp ``can_use_flash_attention``:
    ``backend_supports_grouped_query_attention``) and saves k and v un-repeated. Under autocast the
    patch casts q, k, v (and a float mask) to the autocast dtype first, as autocast does for
    ``scaled_dot_product_attention`` (on its lower-precision list) but not for the kernel ops called
    here: RoPE leaves q and k in fp32 when the cos/sin follow an fp32 residual stream (StarCoder2,
    Llama under bf16-mixed). Returns an undo function."""
    import torch.nn.functional as F

    original = F.scaled_dot_product_attention

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        grouped = enable_gqa and attn_mask is None and query.shape[1] % key.shape[1] == 0
        if dropout_p > 0 and (query.shape[1] == key.shape[1] or grouped):
            if torch.is_autocast_enabled("cpu"):
                dtype = torch.get_autocast_dtype("cpu")
                query, key, value = (t.to(dtype) for t in (query, key, value))
                if attn_mask is not None and attn_mask.is_floating_point():
                    attn_mask = attn_mask.to(dtype)
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


def real_mask_decisions():
    """A patch of transformers' packed-sequence detection for fake tensors. Given position ids and no
    attention mask, ``masking_utils.find_packed_sequence_indices`` reads the ids' values to tell
    whether several sequences are packed in one row; a fake tensor has no values, so it reports
    packing (``is_tracing``), which makes every model build a full (b, 1, s, s) mask and, with
    SDPA, repeat k/v per query head (no ``enable_gqa`` with a mask) and save the copies: a
    trace-only cost that no real run of the probe's input pays. The probe's rows are single
    sequences (position ids 0..s-1), for which the real function returns None: so does the patch.
    Returns an undo function."""
    from transformers import masking_utils

    original = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    return lambda: setattr(masking_utils, "find_packed_sequence_indices", original)


def fp8_autocast_on_cpu():
    """A patch of torchao's ``Float8Linear.forward`` for CPU traces: it casts its input to the
    autocast dtype when *CUDA* autocast is on (``torch.is_autocast_enabled()``, "hardcode to GPU's
    autocast dtype"), so under the trace's CPU autocast it would keep (and save) the fp32 input a
    GPU run casts to bf16. The patch makes the same cast under CPU autocast. Returns an undo
    function (a no-op without torchao)."""
    try:
        from torchao.float8.float8_linear import Float8Linear
    except ImportError:
        return lambda: None
    original = Float8Linear.forward

    def forward(self, input):
        if torch.is_autocast_enabled("cpu"):
            input = input.to(torch.get_autocast_dtype("cpu"))
        return original(self, input)

    Float8Linear.forward = forward
    return lambda: setattr(Float8Linear, "forward", original)


def gpu_kernels(config):
    """The GPU kernels' allocations for fake tensors on the CPU: SDPA with dropout and dropout
    (``gpu_attention_with_dropout``, ``gpu_dropout``), the mask decisions of a real run
    (``real_mask_decisions``) and, for an fp8 plan, fp8's autocast (``fp8_autocast_on_cpu``; torchao
    is imported only then: half a second of each trace's start). Returns one undo function."""
    fp8 = str(config.precision) == "fp8-mixed"
    undo = [gpu_attention_with_dropout(), gpu_dropout(), real_mask_decisions(), *([fp8_autocast_on_cpu()] if fp8 else [])]
    return lambda: [u() for u in undo]
