"""The adapter inventory (planner/cost/adapters.py) against the real libraries: peft's trainable
parameters on every catalog family built on the meta device, and bitsandbytes' NF4 storage of
real tensors."""

import pytest

from planner.catalog.models import catalog, resolve_model
from planner.cost import activations, adapters, params
from planner.strategies.adapter import target_modules

from helpers import FULL, covering

peft = pytest.importorskip("peft")
torch = pytest.importorskip("torch")

#: One catalog model per family.
FAMILY_MODELS = ["meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-0.5B", "Qwen/Qwen3-0.6B", "mistralai/Mistral-7B-v0.3",
                 "mistralai/Mixtral-8x7B-v0.1", "google/gemma-2-2b", "microsoft/Phi-3-mini-4k-instruct",
                 "openai-community/gpt2"]
#: transformers' module names of the attention projections, per family (the ``attention`` set).


def lora(model, family: str, targets: str, rank: int, dora: bool = False):
    """``model`` wrapped by peft: LoRA (or DoRA) of ``rank`` on the target set's modules."""
    modules = target_modules(targets, family)  # what the emitted runtime.json names
    config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=modules, use_dora=dora, task_type="CAUSAL_LM")
    return peft.get_peft_model(model, config)


def peft_model(model_id: str, targets: str, rank: int, dora: bool):
    from planner.probes.meta_model import build_on_meta

    return lora(build_on_meta(catalog()[model_id].config), resolve_model(model_id).family, targets, rank, dora)


def trainable(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_llama_3_1_8b_rank_16_all_linear_is_the_published_count():
    assert adapters.adapter_parameters(resolve_model("meta-llama/Llama-3.1-8B"), adapters.ALL_LINEAR, 16) == 41_943_040


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("model_id, targets", covering(FAMILY_MODELS, adapters.TARGETS))  # CI: each model once
def test_trainable_parameters_equal_peft(model_id, targets):
    """LoRA at rank 16 and DoRA at rank 8 (magnitudes included), exactly as peft counts them; where
    the model has no q_proj and v_proj (a fused qkv), or its MLP is a MoE's router and fused expert
    parameters, peft finds no ``qv`` or ``mlp`` target module either."""
    spec = resolve_model(model_id)
    if not adapters.supports(spec, targets):
        with pytest.raises(ValueError, match="not found"):
            peft_model(model_id, targets, 16, False)
        return
    for rank, dora in ((16, False), (8, True)):
        if dora and not adapters.dora_supported(spec, targets):
            with pytest.raises(ValueError, match="use_dora"):
                peft_model(model_id, targets, rank, dora)
            continue
        assert adapters.adapter_parameters(spec, targets, rank, dora) == trainable(peft_model(model_id, targets, rank, dora))


@pytest.mark.filterwarnings("ignore")
def test_moe_experts_get_one_adapter_pair_over_all_experts_and_a_doubled_rank_on_gate_up():
    """The shapes, not only the count: peft's ParamWrapper on Mixtral's fused expert tensors."""
    spec = resolve_model("mistralai/Mixtral-8x7B-v0.1")
    shapes = {t.name: t.shape for t in adapters.adapter_tensors(spec, adapters.ALL_LINEAR, 16, False)}
    model = peft_model("mistralai/Mixtral-8x7B-v0.1", adapters.ALL_LINEAR, 16, False)
    got = {n: tuple(p.shape) for n, p in model.named_parameters() if p.requires_grad and ".layers.0." in n}
    assert shapes["mlp.gate_up_proj.lora_A"] == got["base_model.model.model.layers.0.mlp.experts.base_layer.lora_A.default.weight"] == (256, 4096)
    assert shapes["mlp.down_proj.lora_B"] == got["base_model.model.model.layers.0.mlp.experts.lora_B.default.weight"] == (4096, 128)


@pytest.mark.parametrize("shape", [(4096, 4096), (1024, 4096), pytest.param((14336, 4096), marks=FULL), (100, 196),
                                   (7, 9)])  # (CI: the rows of 4096 whole blocks once, without the largest)
@pytest.mark.parametrize("double_quant", [False, True])
def test_nf4_bytes_equal_bitsandbytes(shape, double_quant):
    """Quantize a real tensor with bitsandbytes and add up what it keeps: the packed codes and
    every tensor of its quantization state."""
    bnb = pytest.importorskip("bitsandbytes")
    packed, state = bnb.functional.quantize_4bit(torch.randn(*shape, dtype=torch.bfloat16), blocksize=adapters.NF4_BLOCK,
                                                 compress_statistics=double_quant, quant_type="nf4",
                                                 quant_storage=torch.bfloat16)
    parts = [packed, state.absmax, state.code]
    if state.nested:
        parts += [state.state2.absmax, state.state2.code, state.offset]
        assert state.state2.blocksize == adapters.NF4_NESTED_BLOCK
    assert state.nested == double_quant
    numel = shape[0] * shape[1]
    assert adapters.nf4_bytes(numel, double_quant) == sum(t.numel() * t.element_size() for t in parts)
    # FSDP-QLoRA: the codes FSDP shards, viewed as the 16-bit quant storage; the state every rank keeps
    assert packed.dtype == torch.bfloat16 and packed.numel() == adapters.nf4_storage_elements(numel, 2)
    if double_quant:
        assert adapters.nf4_state_bytes(numel) == sum(t.numel() * t.element_size() for t in parts[1:])


TINY = {  # small configs of each family, loaded for real (bitsandbytes quantizes on the CPU)
    "llama": dict(model_type="llama", hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=256),
    "mixtral": dict(model_type="mixtral", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, vocab_size=256),
    "gpt2": dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=128),
    "phi3": dict(model_type="phi3", hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4, vocab_size=256, pad_token_id=0),
    # LayerNorm, plain MLP, biases everywhere, GQA (Starcoder2Config's dropouts default to 0)
    "starcoder2": dict(model_type="starcoder2", hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=256),
}


def tiny_checkpoint(path, family: str):
    """A randomly initialised tiny model of ``family`` saved to ``path``, and its ModelSpec as the
    planner reads the saved config.json."""
    import transformers

    config = transformers.AutoConfig.for_model(**TINY[family], attn_implementation="sdpa")
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return resolve_model(str(path / "config.json"))


def tiny_lora_step_flops(path, family: str, targets: str, input_grads: bool = False):
    """One forward and backward (2 x 16 tokens) of the tiny model with LoRA of rank 4 (a real peft
    model on the CPU): its spec, the tokens, and torch's FlopCounterMode counts per op."""
    import transformers
    from torch.utils.flop_counter import FlopCounterMode

    spec = tiny_checkpoint(path, family)
    model = lora(transformers.AutoModelForCausalLM.from_pretrained(path), family, targets, 4)
    if input_grads:
        model.enable_input_require_grads()
    ids = torch.randint(0, spec.vocab_size, (2, 16))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    return spec, ids.numel(), {str(op).split(".")[1]: n for op, n in counter.get_flop_counts()["Global"].items()}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("family", sorted(TINY))
@pytest.mark.parametrize("double_quant", [False, True])
def test_qlora_weights_equal_a_real_4bit_load(tmp_path, family, double_quant):
    """Load a tiny model of the family with transformers' BitsAndBytesConfig (NF4, bf16 storage) and
    compare what each parameter holds, its packed codes and quantization state included, and which
    weights were quantized."""
    pytest.importorskip("bitsandbytes")
    import json

    import transformers

    spec = tiny_checkpoint(tmp_path, family)
    quant = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=double_quant,
                                            bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=quant, device_map="cpu",
                                                              dtype=torch.bfloat16)
    loaded = 0
    for p in model.parameters():
        loaded += p.numel() * p.element_size()
        if (state := getattr(p, "quant_state", None)) is not None:
            parts = [state.absmax, state.code] + ([state.state2.absmax, state.state2.code, state.offset] if state.nested else [])
            loaded += sum(t.numel() * t.element_size() for t in parts)
    quantized = sum(type(p).__name__ == "Params4bit" for p in model.parameters())
    expected = sum(adapters.bnb_quantized(spec, t) * params.multiplicity(spec, t) for t in params.model_tensors(spec))
    assert quantized == expected, json.dumps(TINY[family])
    assert adapters.qlora_weight_bytes(spec, double_quant) == loaded


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("family", sorted(TINY))
def test_int8_weights_equal_a_real_8bit_load(tmp_path, family):
    """Load a tiny model of the family with ``BitsAndBytesConfig(load_in_8bit=True)`` (LLM.int8(),
    bitsandbytes on the CPU): every parameter's bytes and each int8 weight's fp32 row scales
    (``SCB``) sum to planner's int8 base, and the same weights are quantized."""
    pytest.importorskip("bitsandbytes")
    import transformers

    spec = tiny_checkpoint(tmp_path, family)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, quantization_config=transformers.BitsAndBytesConfig(load_in_8bit=True), device_map="cpu",
        dtype=torch.bfloat16)
    loaded = sum(p.numel() * p.element_size() for p in model.parameters())
    loaded += sum(p.SCB.numel() * p.SCB.element_size() for p in model.parameters() if type(p).__name__ == "Int8Params")
    quantized = sum(type(p).__name__ == "Int8Params" for p in model.parameters())
    assert quantized == sum(adapters.bnb_quantized(spec, t) * params.multiplicity(spec, t) for t in params.model_tensors(spec))
    packed, rest = adapters.quantized_weight_parts(spec, adapters.AdapterSpec("all-linear", 4, 0.0, int8=True))
    assert packed + 2 * rest == loaded


#: (family, target set) pairs a tiny model can carry: a fused qkv (Phi-3, GPT-2) has no q and v pair.
FLOPS_CELLS = [(f, t) for f in ("llama", "phi3", "gpt2", "starcoder2") for t in adapters.TARGETS
               if not (t == adapters.QV and f in ("phi3", "gpt2"))]
#: The target sets a MoE model carries (its MLP is a router and fused expert parameters: no ``mlp``).
MOE_TARGETS = [t for t in adapters.TARGETS if t != adapters.MLP]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("family, targets", FLOPS_CELLS)
@pytest.mark.parametrize("input_grads", [False, True])
def test_adapter_step_matmul_flops_equal_torchs_count(tmp_path, family, targets, input_grads):
    """One forward and backward of a real peft model (tiny, CPU, SDPA), FLOPs of its matmuls (mm,
    addmm: the projections, the adapters and the head) counted by torch's FlopCounterMode."""
    spec, tokens, counted = tiny_lora_step_flops(tmp_path, family, targets, input_grads)
    matmuls = counted.get("mm", 0) + counted.get("addmm", 0)
    assert matmuls == adapters.adapter_matmul_flops_per_token(spec, targets, 4, input_grads) * tokens


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("targets", MOE_TARGETS)
def test_moe_step_flops_equal_torchs_count(tmp_path, targets):
    """A tiny Mixtral with LoRA: per-token matmuls (mm) and the folds of the router (mm) and the
    experts (baddbmm forward, bmm for the factors' gradients; no other op runs a bmm here), as
    torch's FlopCounterMode counts them. It does not count ``_grouped_mm``, so the experts' own
    matmuls (forward and input gradient, 4 per active element, and folded, the weight gradient,
    2 more) are left out of both."""
    spec, tokens, counted = tiny_lora_step_flops(tmp_path, "mixtral", targets)
    assert not any("grouped" in op for op in counted)
    per_element = 6 if targets == adapters.ALL_LINEAR else 4
    grouped = sum(per_element * params.active_elements(spec, t) for t in params.layer_tensors(spec) if t.routed) * spec.num_layers
    per_token = adapters.adapter_matmul_flops_per_token(spec, targets, 4) - grouped
    assert sum(counted.values()) == per_token * tokens + adapters.fold_flops_per_micro_batch(spec, targets, 4)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("family", ["llama", "phi3", "gpt2"])
def test_an_int8_base_keeps_its_matmul_inputs(saved_tiny, family):
    """LoRA over an LLM.int8() base (bitsandbytes on the CPU, bf16 weights, fp32 adapters under
    bf16 autocast): a real layer saves what planner's list with ``int8`` holds, compared as the
    difference from full fine-tuning (as the LoRA test above): its int8 matmuls keep their inputs,
    which a frozen 16-bit base frees. On the CPU peft's bitsandbytes layer casts each adapter input
    to fp32 (its test is CUDA's autocast, ``casts_adapter_input``), so the CPU run is the list
    with ``cast``; on CUDA under autocast that copy is not made."""
    pytest.importorskip("bitsandbytes")
    from planner.cost import activations
    from planner.cost.activations import DTypes

    path, spec = saved_tiny[family]
    full = layer_saved_per_token(path, family, "sdpa", "bf16-mixed", None)
    model_full = sum(v for _, v in activations.layer_saved(spec, DTypes(2, 2), True, 32))
    for targets in [t for t in adapters.TARGETS if adapters.supports(spec, t)]:
        for dropout in (0.0, 0.1):
            saved = adapters.adapter_layer_saved(spec, DTypes(2, 2), True, 32, targets, 4, dropout, cast=True,
                                                 keeps_inputs=True)
            model = sum(v * (4 if n.endswith("dropout mask") else 1) for n, v in saved)  # (the CPU's fp32 noise)
            traced = layer_saved_per_token(path, family, "sdpa", "bf16-mixed", (targets, dropout), int8=True)
            assert traced - full == model - model_full, (targets, dropout)


def kept_by_quantized_matmuls(path, int8: bool, batch: int, seq: int = 32, reentrant: bool = False) -> tuple[int, int]:
    """Bytes a real peft LoRA model over a bitsandbytes base (bf16 weights, no autocast) keeps on
    its quantized matmuls' autograd contexts after a forward under HF gradient checkpointing
    (non-reentrant as planner's launch runs it, or ``reentrant``), read from the graph: each
    distinct storage once.
    CPU bitsandbytes trains an int8 base through ``MatMul8bitFp`` (``ctx.A``), CUDA through
    ``MatMul8bitLt`` (``ctx.tensors[2]``); NF4 through ``MatMul4Bit`` (``ctx.tensors[0]``).
    Returns (bytes, the quantized matmuls in the graph)."""
    import transformers

    quant = (transformers.BitsAndBytesConfig(load_in_8bit=True) if int8 else
             transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                             bnb_4bit_compute_dtype=torch.bfloat16))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, quantization_config=quant)
    model = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                       target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model.enable_input_require_grads()  # (layer 0's q, k and v then keep theirs too: planner counts every layer)
    model.train()
    ids = torch.randint(0, 256, (batch, seq))
    loss = model(input_ids=ids, labels=ids).loss
    kept, matmuls = {}, 0
    for node in graph_nodes(loss):
        kind = type(node).__name__
        matmuls += kind.startswith("MatMul")
        if kind in KEPT_INPUT and (t := KEPT_INPUT[kind](node)) is not None:
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(kept.values()), matmuls


#: Where bitsandbytes' quantized matmuls keep their input on the autograd node: CUDA's int8, the
#: CPU's int8, NF4 (None from 0.43.2).
KEPT_INPUT = {"MatMul8bitLtBackward": lambda n: n.tensors[2], "MatMul8bitFpBackward": lambda n: n.A,
              "MatMul4BitBackward": lambda n: n.tensors[0]}


def graph_nodes(loss):
    """Every node of ``loss``'s autograd graph, once."""
    stack, visited = [loss.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in visited:
            continue
        visited.add(node)
        yield node
        stack += [n for n, _ in node.next_functions]


@pytest.mark.filterwarnings("ignore")
def test_a_checkpointed_int8_base_keeps_every_layers_matmul_inputs(saved_tiny):
    """LLM.int8()'s matmuls keep their inputs on the autograd context, out of a checkpoint's
    saved-tensor hooks: under non-reentrant checkpointing every layer keeps them until its
    backward, ``kept_input_bytes`` per token per layer (q/k/v's input, o_proj's, gate/up's and
    down's, once each), which planner adds to the checkpointed layer's input; the reentrant
    checkpoint's forward builds no graph, so after it no layer keeps them."""
    pytest.importorskip("bitsandbytes")
    from planner.cost.activations import DTypes

    path, spec = saved_tiny["llama"]
    slope = (kept_by_quantized_matmuls(path, True, 4)[0] - kept_by_quantized_matmuls(path, True, 2)[0]) / (2 * 32)
    assert slope == adapters.kept_input_bytes(spec, DTypes(2, 2)) * spec.num_layers
    # the reentrant checkpoint runs the forward without a graph: no layer keeps them after it
    assert kept_by_quantized_matmuls(path, True, 4, reentrant=True) == (0, 0)


@pytest.mark.filterwarnings("ignore")
def test_todays_bitsandbytes_4bit_matmul_keeps_no_input(saved_tiny):
    """planner plans QLoRA with ``nf4_matmul`` frees-input by default and its launch installs
    bitsandbytes >= 0.45: the installed release is at least ``NF4_FREES_INPUT_SINCE`` and its
    ``MatMul4Bit`` keeps no input in a real checkpointed QLoRA model (before 0.43.2 it kept ``A``)."""
    bnb = pytest.importorskip("bitsandbytes")
    release = tuple(int(x) for x in bnb.__version__.split(".")[:3])
    assert release >= adapters.NF4_FREES_INPUT_SINCE
    path, spec = saved_tiny["llama"]
    kept, matmuls = kept_by_quantized_matmuls(path, False, 2)
    assert kept == 0 and matmuls == len(params.layer_matmuls(spec)) * spec.num_layers


SAVED_TINY = TINY | {
    "qwen3": dict(model_type="qwen3", hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=256),
    "gemma2": dict(model_type="gemma2", hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, vocab_size=256),
    "gpt2": dict(TINY["gpt2"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
}
#: precision (and adapter dtype) -> (weights' dtype, bf16 autocast, fp32 adapters: peft's autocast_adapter_dtype)
SAVED_MODES = {"bf16-mixed": ("bfloat16", True, True), "bf16-pure": ("bfloat16", False, False),
               "fp32": ("float32", False, False), "bf16-pure-fp32-adapters": ("bfloat16", False, True)}


def layer_saved_per_token(path, family: str, attention: str, mode: str, adapter: tuple | None, seq: int = 32,
                          int8: bool = False) -> float:
    """Bytes per token layer 1 of a real model saves for backward (storages, parameters excluded),
    as the slope between micro-batches of 2 and 4 sequences (per-layer constants, such as the
    adapters' autocast weight casts, cancel). ``adapter``: (targets, dropout) for peft LoRA of
    rank 4, or None for full fine-tuning. ``int8``: the base loaded with ``load_in_8bit``, whose
    matmuls keep their tensors on their context, out of the saved-tensor hooks' sight: they are
    read from the autograd graph, and each int8 matmul of layer 1 must keep its module's very
    input (on the CPU bitsandbytes trains through ``MatMul8bitFp``, ``ctx.A``; on CUDA through
    ``MatMul8bitLt``, whose ``ctx.tensors`` keep the same input, ``A``)."""
    import transformers

    dtype, mixed, fp32 = SAVED_MODES[mode]
    sizes = []
    for batch in (2, 4):
        torch.manual_seed(0)
        quant = {"quantization_config": transformers.BitsAndBytesConfig(load_in_8bit=True)} if int8 else {}
        model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation=attention,
                                                                  dtype=getattr(torch, dtype), **quant)
        if adapter is None:
            model.requires_grad_(True)
        else:
            targets, dropout = adapter
            modules = target_modules(targets, family)
            model = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout,
                                                               target_modules=modules, task_type="CAUSAL_LM"),
                                        autocast_adapter_dtype=fp32)
        model.train()
        layer = next(m for n, m in model.named_modules() if n.endswith(("layers.1", "h.1")))
        inside, seen = [False], {}
        layer.register_forward_pre_hook(lambda *a: inside.__setitem__(0, True))
        layer.register_forward_hook(lambda *a: inside.__setitem__(0, False))
        storages = {p.untyped_storage().data_ptr() for p in model.parameters()}

        def pack(t):
            storage = t.untyped_storage()
            if inside[0] and storage.data_ptr() not in storages:
                seen[storage.data_ptr()] = storage.nbytes()
            return t

        inputs = {}  # layer 1's int8 matmuls: input storage -> bytes
        for m in layer.modules():
            if type(m).__name__ == "Linear8bitLt":
                m.register_forward_hook(lambda mod, args, out: inputs.__setitem__(
                    args[0].untyped_storage().data_ptr(), args[0].untyped_storage().nbytes()))
        ids = torch.randint(0, 256, (batch, seq))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
                loss = model(input_ids=ids, labels=ids).loss
        kept = set()
        for node in graph_nodes(loss):
            kind = type(node).__name__
            if kind in ("MatMul8bitLtBackward", "MatMul8bitFpBackward"):  # CUDA's; the CPU's
                ptr = KEPT_INPUT[kind](node).untyped_storage().data_ptr()
                if ptr in inputs:
                    kept.add(ptr)
                    seen[ptr] = inputs[ptr]
        assert kept == set(inputs), "every int8 matmul of layer 1 keeps its input"
        sizes.append(sum(seen.values()))
    return (sizes[1] - sizes[0]) / (2 * seq)


@pytest.fixture(scope="module")
def saved_tiny(tmp_path_factory):
    import transformers

    base, specs = tmp_path_factory.mktemp("saved"), {}
    for family, config in SAVED_TINY.items():
        transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config)).save_pretrained(base / family)
        specs[family] = (base / family, resolve_model(str(base / family / "config.json")))
    return specs


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("family, attention, mode", covering(  # CI: each pair and each mode once
    [("llama", "sdpa"), ("llama", "eager"), ("qwen3", "sdpa"), ("phi3", "sdpa"), ("gpt2", "sdpa"), ("gpt2", "eager"),
     ("gemma2", "eager"), ("starcoder2", "sdpa"), ("starcoder2", "eager")], list(SAVED_MODES), flatten=True))
def test_lora_layer_activations_equal_a_real_peft_layer(saved_tiny, family, attention, mode):
    """What a LoRA layer saves beyond full fine-tuning, exactly as a real peft model on the CPU saves
    it, for both target sets with and without dropout: frozen weights keep no inputs for weight
    gradients, fp32 adapters under autocast each save their own 16-bit input copy (without
    autocast, peft's default fp32 adapters under bf16-pure, their fp32 copy and fp32 A output),
    dropout adds its mask and output per wrapped matmul, A's output.

    Compared as the difference from full fine-tuning of the same model in the same dtypes, measured
    the same way: that cancels what the CPU's kernels save differently from CUDA's in the base
    layer (the full lists follow CUDA and are traced in benchmarks/traced_matrix.py; e.g. the CPU's
    SDPA copies Phi-3's strided v). One CPU fact is applied to the model's figure: the dropout mask
    is a noise tensor in the input's dtype (fp32 after peft's cast under autocast), where CUDA's
    fused dropout keeps a bool mask (planner.cost.activations.DROPOUT_MASK_BYTES)."""
    from planner.cost import activations
    from planner.cost.activations import DTypes

    path, spec = saved_tiny[family]
    dtype, mixed, fp32 = SAVED_MODES[mode]
    c = 4 if dtype == "float32" else 2
    cpu_mask = 2 if mode == "bf16-pure" else 4  # the dropout's input: fp32 after peft's cast, or the weights' dtype
    copy = c if mixed else 4  # A's input copy: autocast's 16-bit cast, or peft's fp32 cast without autocast
    fused = attention == "sdpa"
    full = layer_saved_per_token(path, family, attention, mode, None)
    model_full = sum(v for _, v in activations.layer_saved(spec, DTypes(c, c), fused, 32))
    for targets in [t for t in adapters.TARGETS if adapters.supports(spec, t)]:
        for dropout in (0.0, 0.1):
            saved = adapters.adapter_layer_saved(spec, DTypes(c, c), fused, 32, targets, 4, dropout, cast=fp32 and c == 2,
                                                 copy_bytes=copy)
            model = sum(v * (cpu_mask if n.endswith("dropout mask") else 1) for n, v in saved)
            traced = layer_saved_per_token(path, family, attention, mode, (targets, dropout))
            assert traced - full == model - model_full, (targets, dropout)


def _lora_path_bytes(d_in: int, d_out: int, mode: str, dropout: float, tokens: int = 64,
                     rank: int = 8) -> tuple[float, float]:
    """(forward, backward) bytes per token that the aten operations of peft's LoRA path around a
    real wrapped ``nn.Linear`` read and write, as CUDA runs them: every token-wide tensor (first
    dimension the tokens, or last for a transposed one) an operation reads or writes, less views,
    allocations, the base matmuls (those with the frozen weight) and the gradient seed. The CPU
    decomposes dropout into ``bernoulli_`` and a multiply by an fp mask; CUDA's ``native_dropout``
    reads the input and writes the output and a 1-byte mask, so the mask is counted at 1 byte and
    its making not at all."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    dtype, mixed, fp32 = SAVED_MODES[mode]
    skip = {"t", "detach", "view", "_unsafe_view", "empty_like", "ones_like", "bernoulli_", "div_", "transpose",
            "expand", "alias"}

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.bytes, self.masks, self.done = 0, set(), False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if name in ("bernoulli_", "div_"):
                self.masks.add(args[0].untyped_storage().data_ptr())
            ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            if name in skip or (name == "mm" and any(t.shape in ((d_out, d_in), (d_in, d_out)) for t in ins)):
                return out
            for t, read in [(t, True) for t in ins] + [(t, False) for t in outs]:
                if tokens in (t.shape[0], t.shape[-1]) and rank not in t.shape:
                    mask = read and t.untyped_storage().data_ptr() in self.masks
                    self.bytes += t.numel() * (activations.DROPOUT_MASK_BYTES if mask else t.element_size())
            if self.done:  # the backward has read the mask: its block may hold another tensor next
                self.masks -= {t.untyped_storage().data_ptr() for t in ins}
            return out

    base = torch.nn.Sequential(torch.nn.Linear(d_in, d_out, bias=False)).to(getattr(torch, dtype))
    model = peft.get_peft_model(base, peft.LoraConfig(r=rank, lora_alpha=16, lora_dropout=dropout,
                                                      target_modules=["0"]), autocast_adapter_dtype=fp32)
    model.train()
    x = torch.randn(tokens, d_in, dtype=getattr(torch, dtype), requires_grad=True)
    forward, backward = Count(), Count()
    with forward, torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
        y = model(x)
    seed = torch.ones_like(y)
    backward.masks, backward.done = forward.masks, True
    with backward:
        y.backward(seed)
    return forward.bytes / tokens, backward.bytes / tokens


@pytest.mark.parametrize("mode, dropout", covering(["bf16-mixed", "bf16-pure", "bf16-pure-fp32-adapters"], [0.0, 0.1]))
def test_lora_path_traffic_is_what_peft_runs(mode, dropout):
    """planner.cost.adapters.lora_module_traffic against the aten operations of peft's LoRA layer
    (input and output widths differ, so a swapped term shows), in each precision's adapter
    dtype: fp32 adapters under bf16 autocast, 16-bit adapters and fp32 adapters under bf16-pure."""
    d_in, d_out = 96, 160
    _, mixed, fp32 = SAVED_MODES[mode]
    c = 2
    adapter_bytes = 4 if fp32 else c
    cast = adapter_bytes != c
    want = adapters.lora_module_traffic(d_in, d_out, c, adapter_bytes, cast, mixed, dropout)
    forward, backward = _lora_path_bytes(d_in, d_out, mode, dropout)
    assert (forward, backward) == (want.forward, want.backward)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("targets", adapters.TARGETS)
def test_the_live_check_reads_the_target_set_peft_wrapped(targets):
    """planner.launch.live reads a running job's adapter back into the plan's vocabulary: the
    target set and the trainable count of a peft model built from the plan's target_modules."""
    from planner.launch.live import _adapter

    seen = _adapter(peft_model("meta-llama/Llama-3.2-1B", targets, 8, False))
    assert seen["lora_targets"] == targets
    spec = resolve_model("meta-llama/Llama-3.2-1B")
    assert seen["details"]["trainable_parameters"] == adapters.adapter_parameters(spec, targets, 8)


@pytest.mark.parametrize("adapter, nf4_matmul, kept", [("lora-int8", "frees-input", True), ("lora", "frees-input", False),
                                                       ("qlora", "frees-input", False), ("qlora", "keeps-input", True)])
def test_checkpointed_layers_hold_what_the_quantized_matmuls_keep(adapter, nf4_matmul, kept):
    """Under full checkpointing each layer's saved row is its input, plus what the quantized
    base's matmuls keep out of the checkpoint's sight (``kept_input_bytes``): LLM.int8() always,
    NF4 only as bitsandbytes < 0.43.2 ran it; a 16-bit base keeps nothing more."""
    from planner.catalog.gpus import parse_gpus
    from planner.cost.activations import DTypes
    from planner.engine.estimate import evaluate
    from planner.strategies import TrainingConfig

    model = resolve_model("meta-llama/Llama-3.1-8B")
    config = TrainingConfig(adapter=adapter, nf4_matmul=nf4_matmul, checkpointing="full", sharding="ddp",
                            micro_batch_size=2, seq_len=1024, precision="bf16-mixed")
    rows = evaluate(model, parse_gpus("2xH100-80"), config).ledger.rows
    saved = next(r for r in rows if r.label.startswith("saved activations"))
    per_layer = 2 * model.hidden_size + (adapters.kept_input_bytes(model, DTypes(2, 2)) if kept else 0)
    assert saved.bytes == pytest.approx(per_layer * model.num_layers * 2 * 1024, abs=1)


def prepared_layer_saved_per_token(path, prep: str, targets: list[str], dropout: float, seq: int = 32) -> float:
    """Bytes per token layer 1 of a real peft QLoRA model saves for backward (storages, parameters
    excluded), as the slope between micro-batches of 2 and 4 sequences, under bf16 autocast:
    bitsandbytes NF4 base (bf16 compute), then the plan's ``kbit_prep`` as planner's runtime applies
    it (peft's ``prepare_model_for_kbit_training``; for fp32-norms the embeddings and head back to
    bf16, as TRL <= 0.25 does), then peft LoRA of rank 4 with fp32 adapters. peft's bitsandbytes
    layers ask ``torch.is_autocast_enabled()``, which reads CUDA's autocast: it is made to read the
    CPU's here, so the adapters take CUDA's branch (no cast of their input by peft)."""
    import transformers

    from planner.runtime.adapter import kbit_prepare
    from planner.strategies import TrainingConfig

    config = TrainingConfig(adapter="qlora", kbit_prep=prep, precision="bf16-mixed")
    quant = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                            bnb_4bit_compute_dtype=torch.bfloat16)
    sizes = []
    for batch in (2, 4):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, quantization_config=quant,
                                                                  attn_implementation="sdpa")
        kbit_prepare(model, config)
        model = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=targets,
                                                           task_type="CAUSAL_LM"))
        model.train()
        layer = next(m for n, m in model.named_modules() if n.endswith("layers.1"))
        inside, seen = [False], {}
        layer.register_forward_pre_hook(lambda *a: inside.__setitem__(0, True))
        layer.register_forward_hook(lambda *a: inside.__setitem__(0, False))
        storages = {p.untyped_storage().data_ptr() for p in model.parameters()}

        def pack(t):
            if inside[0] and t.untyped_storage().data_ptr() not in storages:
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        ids = torch.randint(0, 256, (batch, seq))
        reads = torch.is_autocast_enabled
        torch.is_autocast_enabled = lambda *a: reads(*a) if a else reads("cpu")
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
                model(input_ids=ids, labels=ids)
        finally:
            torch.is_autocast_enabled = reads
        sizes.append(sum(seen.values()))
    return (sizes[1] - sizes[0]) / (2 * seq)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("family, prep", [  # CI: each preparation once, the families alternating
    pytest.param(f, p, marks=() if (f, p) in (("llama", "none"), ("qwen3", "fp32-norms"), ("llama", "fp32")) else FULL)
    for p in ("none", "fp32-norms", "fp32") for f in ("llama", "qwen3")])
def test_a_kbit_prepared_qlora_layer_saves_what_the_model_lists(saved_tiny, family, prep):
    """A QLoRA layer's saved tensors, exactly as a real peft model over a bitsandbytes NF4 base
    saves them under bf16 autocast, with and without peft's ``prepare_model_for_kbit_training``,
    for both target sets, with and without dropout: prepared, the fp32 norms make the norms'
    outputs fp32, ``Linear4bit`` returns the MLP's gate and up in fp32 (so the activation and the
    product are fp32), and every wrapped matmul reading an fp32 input saves its own 16-bit cast.
    One CPU fact is applied to the model's figure: the dropout mask is a noise tensor in the
    dropout input's dtype (fp32 for the prepared projections reading a norm's output or the MLP's
    product), where CUDA's fused dropout keeps a bool mask."""
    pytest.importorskip("bitsandbytes")
    from planner.cost.activations import DTypes

    path, spec = saved_tiny[family]
    prepared = prep != "none"
    dt = DTypes(2, 4) if prepared else DTypes(2, 2)
    for targets in ("all-linear", "qv"):
        for dropout in (0.0, 0.1):
            saved = adapters.adapter_layer_saved(spec, dt, True, 32, targets, 4, dropout, False, prepared=prepared)
            fp32_input = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "down_proj")
            model = sum(v * ((4 if prepared and any(p in n for p in fp32_input) else 2) if n.endswith("dropout mask")
                             else 1) for n, v in saved)
            real = prepared_layer_saved_per_token(path, prep, target_modules(targets, family), dropout)
            assert real == model, (targets, dropout)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("prep", ["fp32-norms", "fp32"])
def test_kbit_prepared_fp32_parameters_equal_a_real_prepared_base(saved_tiny, prep):
    """The unquantized parameters planner keeps in fp32 over a prepared 4-bit base
    (``kbit_prepared_fp32_elements``): those of a real NF4 load after planner's runtime applies
    the preparation, counted by dtype; the rest stay bf16 (fp32-norms: the embeddings and head)."""
    pytest.importorskip("bitsandbytes")
    import transformers

    from planner.runtime.adapter import kbit_prepare
    from planner.strategies import TrainingConfig
    from planner.strategies.adapter import spec_of

    path, spec = saved_tiny["llama"]
    config = TrainingConfig(adapter="qlora", kbit_prep=prep, precision="bf16-mixed")
    quant = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                            bnb_4bit_compute_dtype=torch.bfloat16)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, quantization_config=quant)
    kbit_prepare(model, config)
    plain = [p for p in model.parameters() if type(p).__name__ != "Params4bit"]
    fp32 = sum(p.numel() for p in plain if p.dtype == torch.float32)
    assert fp32 == adapters.kbit_prepared_fp32_elements(spec, spec_of(config))
    assert sum(p.numel() for p in plain) - fp32 == (0 if prep == "fp32" else 2 * spec.vocab_size * spec.hidden_size)


@pytest.mark.filterwarnings("ignore")
def test_a_4bit_base_loads_whole_under_zero3(tmp_path):
    """transformers builds a quantized model without DeepSpeed's ``zero.Init``: under a ZeRO-3
    config every parameter of a tiny NF4 Llama loads whole (no ZeRO-3 ``ds_id``), so each GPU holds
    the whole 4-bit base until DeepSpeed partitions it; what it holds, codes in the bf16 quant
    storage with their quantization state and the rest in bf16, is planner's
    ``whole_load_bytes`` for the ZeRO-3 QLoRA plan."""
    pytest.importorskip("bitsandbytes")
    pytest.importorskip("deepspeed")
    import transformers
    from transformers.integrations import HfDeepSpeedConfig
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    from planner.catalog.gpus import parse_gpus
    from planner.strategies import PlanContext, TrainingConfig
    from planner.strategies.adapter import whole_load_bytes

    spec = tiny_checkpoint(tmp_path, "llama")
    zero3 = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "bf16": {"enabled": True},
                               "train_micro_batch_size_per_gpu": 1})
    try:
        assert is_deepspeed_zero3_enabled()
        quant = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                                bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)
        model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=quant, dtype=torch.bfloat16)
    finally:
        del zero3
    loaded = 0
    for p in model.parameters():
        assert not hasattr(p, "ds_id")  # not partitioned
        loaded += p.numel() * p.element_size()
        if (state := getattr(p, "quant_state", None)) is not None:
            loaded += sum(t.numel() * t.element_size() for t in (state.absmax, state.code, state.state2.absmax,
                                                                 state.state2.code, state.offset))
    config = TrainingConfig(adapter="qlora", sharding="zero3", precision="bf16-mixed")
    assert whole_load_bytes(PlanContext(spec, parse_gpus("2xA100-40"), config)) == loaded


def test_zero3_qlora_holds_the_whole_base_it_loaded():
    """A ZeRO-3 QLoRA plan's peak is at least the whole 4-bit base each GPU loads, with the CUDA
    context: Llama-2-70B on two 24 GB cards trains in a 17 GiB partition a rank but cannot load,
    and planner says so; on two 40 GB cards it fits (PEFT's guide: 36.6 GB a GPU)."""
    from planner.catalog.gpus import parse_gpus
    from planner.engine.estimate import WHOLE_LOAD_LABEL, estimate_config
    from planner.strategies import PlanContext, TrainingConfig
    from planner.strategies.adapter import whole_load_bytes

    model = resolve_model("meta-llama/Llama-2-70b-hf")
    config = TrainingConfig(adapter="qlora", sharding="zero3", precision="bf16-mixed", checkpointing="full",
                            micro_batch_size=1, seq_len=2048, lora_rank=8)
    for gpus, fits in (("2xRTX4090-24", False), ("2xA100-40", True)):
        hardware = parse_gpus(gpus)
        r = estimate_config(model, hardware, config)
        whole = whole_load_bytes(PlanContext(model, hardware, config))
        assert r.feasible and r.fits is fits and r.memory["peak"] >= whole > 30 * 2**30
        assert any(row.label == WHOLE_LOAD_LABEL for row in r.ledger)
