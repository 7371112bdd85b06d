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
A fake process group is one per process, so each degree runs in its own child:

    python -m planner.probes.tensor_parallel T SEQ '{"llama": {...config kwargs...}}'

prints one JSON object, keyed "<family> <degree>" (degree 1 and T). Used by
tests/test_tensor_parallel.py and benchmarks/tp_activations.py.
"""

import json
import sys


def measure(configs: dict[str, dict], t: int, seq: int) -> dict[str, dict]:
    """The module docstring's figures for each ``family: config kwargs`` of ``configs`` at degrees 1
    and ``t`` (this process's fake process group: ``t`` ranks). Gemma-2 runs eager attention
    (transformers has no SDPA for it), the others SDPA."""
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

    def all_reduces(mode) -> int:
        return mode.get_comm_counts().get(torch.ops.c10d_functional.all_reduce, 0)

    mesh = init_device_mesh("cpu", (t,))  # (outside fake mode: the mesh reads a real tensor)
    out = {}
    for family, kw in configs.items():
        for tp in (1, t):
            cfg = transformers.AutoConfig.for_model(model_type=family, **kw)
            cfg._attn_implementation = "eager" if family == "gemma2" else "sdpa"
            with FakeTensorMode(allow_non_fake_inputs=True):
                with no_tie_weights():
                    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
                if tp > 1:
                    plan, _, _ = model._resolve_parallel_plans(DistributedConfig(tp_size=tp))
                    apply_tensor_parallelism(model, mesh, plan)
                model.tie_weights()
                layer = model.model.layers[0]
                h = torch.randn(1, seq, cfg.hidden_size, dtype=torch.bfloat16, requires_grad=True)
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
                y = y[0] if isinstance(y, tuple) else y
                with backward:
                    y.float().sum().backward()
            out[f"{family} {tp}"] = {
                "params": sum(local(p).numel() for p in model.parameters()),
                "layer_params": sum(local(p).numel() for p in layer.parameters()),
                "saved_per_token": sum(saved.values()) / seq,
                "all_reduces": [all_reduces(forward), all_reduces(backward)],
            }
    return out


if __name__ == "__main__":
    print(json.dumps(measure(json.loads(sys.argv[3]), int(sys.argv[1]), int(sys.argv[2]))))
