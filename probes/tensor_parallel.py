"""What one rank of a tensor-parallel group holds, saves and exchanges, measured on transformers'
own model: fake tensors over a fake process group of T ranks, rank 0's view.

For each model config the model is built as ``from_pretrained(distributed_config=DistributedConfig(
tp_size=T))`` builds it (untied, its plan resolved by ``_resolve_parallel_plans`` and applied by
``apply_tensor_parallelism``, then tied), once without the split and once with it; then:
- ``params``, ``layer_params``: elements of the parameters' local shards (the whole model, layer 0);
- ``saved_per_token``: bytes per token of the tensors decoder layer 0 saves for backward
  (autograd's saved-tensor hooks, each storage once, parameters and the shared rotary tables left
  out), at ``seq`` tokens of one sequence;
- ``all_reduces``: the all-reduces layer 0 runs in its forward and in its backward (torch's
  ``CommDebugMode``).
- ``collectives``: the all-reduces, all-gathers and reduce-scatters of layer 0, each [forward,
  backward].

With ``sp`` Llama's layer is also split (keyed "llama <T> sp") as torchtitan splits its Llama 3 block,
tensor and sequence parallel (torchtitan ``models/llama3/parallelize.py`` ``apply_tp``; torch's
``parallelize_module`` styles), on transformers' module names: each norm ``SequenceParallel()``,
attention's and the MLP's input ``PrepareModuleInput`` from ``Shard(1)`` (this rank's positions) to
``Replicate()`` (all-gathered), q, k, v, gate and up ``ColwiseParallel()``, o and down
``RowwiseParallel(output_layouts=Shard(1))`` (reduce-scattered over the positions). The layer's
input is then this rank's ``SEQ / T`` positions, the rotary tables every position's.

A fake process group is one per process, so each degree runs in its own child:

    python -m planner.probes.tensor_parallel T SEQ '{"llama": {...config kwargs...}}' [sp]

prints one JSON object, keyed "<family> <degree>" (degree 1 and T). Used by
tests/test_tensor_parallel.py and benchmarks/tp_activations.py.
"""

import json
import sys


def measure(configs: dict[str, dict], t: int, seq: int, sp: bool = False) -> dict[str, dict]:
    """The module docstring's figures for each ``family: config kwargs`` of ``configs`` at degrees 1
    and ``t`` (this process's fake process group: ``t`` ranks); with ``sp``, Llama's also under
    torchtitan's tensor and sequence parallel split (keyed "llama <t> sp"). Gemma-2 runs eager
    attention (transformers has no SDPA for it), the others SDPA."""
    if sp and "llama" not in configs:
        raise ValueError("the sequence-parallel split is torchtitan's Llama 3 block's: give a llama config")
    import torch

    from planner.probes.model_setup import fake_process_group

    fake_process_group(t)
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.multiprocessing.reductions import StorageWeakRef
    from transformers.distributed import DistributedConfig
    from transformers.distributed.tensor_parallel import apply_tensor_parallelism
    from transformers.initialization import no_tie_weights

    def local(p):
        return p.to_local() if isinstance(p, DTensor) else p

    def ref(x) -> int:
        return StorageWeakRef(local(x).untyped_storage()).cdata

    def counts(mode, op) -> int:
        return mode.get_comm_counts().get(op, 0)

    ops = {"all_reduce": torch.ops.c10d_functional.all_reduce,
           "all_gather": torch.ops.c10d_functional.all_gather_into_tensor,
           "reduce_scatter": torch.ops.c10d_functional.reduce_scatter_tensor}

    mesh = init_device_mesh("cpu", (t,))  # (outside fake mode: the mesh reads a real tensor)
    out = {}
    runs = [(family, tp, False) for family in configs for tp in (1, t)] + ([("llama", t, True)] if sp else [])
    for family, tp, split_sequence in runs:
        kw = configs[family]
        cfg = transformers.AutoConfig.for_model(model_type=family, **kw)
        cfg._attn_implementation = "eager" if family == "gemma2" else "sdpa"
        with FakeTensorMode(allow_non_fake_inputs=True):
            with no_tie_weights():
                model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
            if split_sequence:
                _torchtitan_split(model.model.layers[0], mesh)
            elif tp > 1:
                plan, _, _ = model._resolve_parallel_plans(DistributedConfig(tp_size=tp))
                apply_tensor_parallelism(model, mesh, plan)
            model.tie_weights()
            layer = model.model.layers[0]
            positions = seq // tp if split_sequence else seq  # the layer's input: this rank's positions
            h = torch.randn(1, positions, cfg.hidden_size, dtype=torch.bfloat16, requires_grad=True)
            pos = torch.arange(seq)[None]
            rope = model.model.rotary_emb(h, pos)
            skip = {ref(p) for p in model.parameters()} | {ref(x) for x in rope}
            saved: dict[int, int] = {}

            def pack(x, saved=saved, skip=skip):
                if ref(x) not in skip:
                    saved.setdefault(ref(x), local(x).untyped_storage().nbytes())
                return x

            forward, backward = CommDebugMode(), CommDebugMode()
            with forward, torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
                y = layer(h, position_embeddings=rope, attention_mask=None, position_ids=pos)
            y = local(y[0] if isinstance(y, tuple) else y)
            with backward:
                y.float().sum().backward()
        out[f"{family} {tp}" + (" sp" if split_sequence else "")] = {
            "params": sum(local(p).numel() for p in model.parameters()),
            "layer_params": sum(local(p).numel() for p in layer.parameters()),
            "saved_per_token": sum(saved.values()) / seq,
            "all_reduces": [counts(forward, ops["all_reduce"]), counts(backward, ops["all_reduce"])],
            "collectives": {name: [counts(forward, op), counts(backward, op)] for name, op in ops.items()},
        }
    return out


def _torchtitan_split(layer, mesh) -> None:
    """torchtitan's tensor and sequence parallel plan of a Llama 3 block, on transformers' names
    (the module docstring)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    parallelize_module(layer, mesh, {
        "input_layernorm": SequenceParallel(),
        # (transformers passes attention's input by keyword, the MLP's by position)
        "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                        desired_input_kwarg_layouts={"hidden_states": Replicate()}),
        "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
        "post_attention_layernorm": SequenceParallel(),
        "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
    })


if __name__ == "__main__":
    print(json.dumps(measure(json.loads(sys.argv[3]), int(sys.argv[1]), int(sys.argv[2]), sys.argv[4:] == ["sp"])))
