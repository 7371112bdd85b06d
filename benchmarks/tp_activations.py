"""What a decoder layer saves for backward under transformers' own tensor parallelism: measured on
fake tensors, per token and layer, for issue 39 (tensor parallelism composed with FSDP2).

transformers 5 shards a model by its ``base_model_tp_plan`` (Llama: q, k, v, gate and up
``colwise``, o and down ``rowwise``; transformers/distributed/tensor_parallel.py
``apply_tensor_parallelism``): in training each sharded linear runs on DTensors, its input
redistributed to ``Replicate`` (colwise) or ``Shard(-1)`` (rowwise), the rowwise output reduced to
``Replicate``. Here the real Llama model (transformers' modeling code, SDPA) of Llama-3.1-8B's
widths is built on fake tensors, sharded over a fake process group of T ranks, and run forward
once with ``labels`` (the loss's tensors are outside the layers); torch's MemTracker counts the
activations alive at the forward's end. Two depths' difference is one layer's saved tensors, in
16-bit elements per token, against T: a replicated part R and a part S split T ways fit
``R + S / T``.

    python benchmarks/tp_activations.py [--tokens 1024]

Prints, per T, the layer's elements per token and the fit. Not yet planner's model: the plan's
tensor-parallel rows are issue 39's to write from these figures.
"""

import argparse
import subprocess
import sys

CHILD = r"""
import re, sys, torch
from planner.probes.model_setup import fake_process_group
T, L, S = (int(x) for x in sys.argv[1:4])
fake_process_group(T)
import transformers
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.device_mesh import init_device_mesh

cfg = transformers.AutoConfig.for_model(
    model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=L, num_attention_heads=32,
    num_key_value_heads=8, vocab_size=128256, max_position_embeddings=S, use_cache=False)
cfg._attn_implementation = "sdpa"
mesh = init_device_mesh("cpu", (T,)) if T > 1 else None  # (outside fake mode: the mesh reads a real tensor)
with FakeTensorMode(allow_non_fake_inputs=True):
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    if mesh is not None:
        from transformers.distributed.tensor_parallel import apply_tensor_parallelism

        # the base plan's module patterns, each module's hooks and its parameters' sharding
        modules, plan = dict(model.named_modules()), {}
        for pattern, style in cfg.base_model_tp_plan.items():
            rx = re.compile("^model\\." + re.escape(pattern).replace("\\*", "\\d+") + "$")
            for name, module in modules.items():
                if rx.match(name):
                    plan[name] = style
                    plan |= {f"{name}.{p}": style for p, _ in module.named_parameters(recurse=False)}
        apply_tensor_parallelism(model, mesh, plan)
    ids = torch.randint(0, cfg.vocab_size, (1, S))
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        model(input_ids=ids, labels=ids)
        snapshot = tracker.get_tracker_snapshot("current")
print(sum(v for d in snapshot.values() for k, v in d.items() if str(getattr(k, "value", k)) == "Activation"))
"""


def activations(t: int, layers: int, tokens: int) -> int:
    out = subprocess.run([sys.executable, "-c", CHILD, str(t), str(layers), str(tokens)], capture_output=True,
                         text=True, check=True, timeout=600).stdout.split()
    return int(out[-1])


def layer_elements(t: int, tokens: int) -> float:
    """One decoder layer's saved activations under T-way TP, 16-bit elements per token."""
    return (activations(t, 2, tokens) - activations(t, 1, tokens)) / 2 / tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1024)
    args = ap.parse_args()
    found = {t: layer_elements(t, args.tokens) for t in (1, 2, 4, 8)}
    print(f"Llama-3.1-8B widths, {args.tokens:,} tokens, transformers' base_model_tp_plan, SDPA, bf16")
    print(f"{'T':>3} {'elements/token/layer':>22}")
    for t, e in found.items():
        print(f"{t:>3} {e:>22,.0f}")
    sharded = (found[1] - found[8]) / (1 - 1 / 8)
    print(f"fit R + S/T from T=1 and T=8: R {found[1] - sharded:,.0f} (replicated), S {sharded:,.0f} (split); "
          + ", ".join(f"T={t} off by {found[t] - (found[1] - sharded + sharded / t):+,.0f}" for t in (2, 4)))


if __name__ == "__main__":
    main()
