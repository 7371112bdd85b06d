"""What a decoder layer saves for backward under transformers' own tensor parallelism, against
planner's rows and Megatron's formula (issue 39: tensor parallelism composed with FSDP2).

transformers 5 shards a model by its ``base_model_tp_plan`` (Llama: q, k, v, gate and up
``colwise``, o and down ``rowwise``; planner/cost/tensor.py): the norms and the column-parallel
projections' input stay whole on every rank, the per-head tensors and the MLP's intermediates are
split. Here a layer of Llama-3.1-8B's widths (SDPA, bf16) is run on fake tensors over a fake process
group of T ranks (planner/probes/tensor_parallel.py: autograd's saved tensors of one layer, each
storage once) and compared with planner's ``layer_saved`` of the rank's model (``rank_model``) and with Korthikanti et al.
2022's tensor-parallel (no sequence parallelism) figure for a GPT block, s*b*h*(10 + 24/t + 5*a*s/(h*t))
bytes (arXiv:2205.05198 Sec. 4.2.1; eager attention and dropout, hence its s^2 term): the
torch-native layer keeps 16*h + 8 bytes per token whole on every rank (the fp32 norm inputs and
statistics, the normalised tensors, the projections' input) against Megatron's 10*h.

Then the same layer split as torchtitan splits its Llama 3 block, tensor and sequence parallel
(planner/probes/tensor_parallel.py ``sp``), against ``sequence_parallel_layer_bytes`` and
Korthikanti et al.'s sequence-parallel figure, s*b*h*(34/t + 5*a*s/(h*t)) (Sec. 4.2.2, Eq. 5):
torch's matmuls save the all-gathered inputs whole (4*h bytes per token on every rank) where
Megatron saves the rank's shard and gathers it again in backward.

    python benchmarks/tp_activations.py [--tokens 1024]
"""

import argparse
import json
import subprocess
import sys

LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=1, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=128256, use_cache=False)


def measured(t: int, tokens: int, sp: bool = False) -> dict:
    config = {"llama": LLAMA_8B | {"max_position_embeddings": tokens}}
    out = subprocess.run([sys.executable, "-m", "planner.probes.tensor_parallel", str(t), str(tokens), json.dumps(config),
                          *(["sp"] if sp else [])], capture_output=True, text=True, check=True, timeout=900).stdout
    return json.loads(out.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1024)
    args = ap.parse_args()
    import transformers

    from planner.catalog.families import spec_from_config
    from planner.cost import activations, tensor

    m = spec_from_config(transformers.AutoConfig.for_model(model_type="llama", **LLAMA_8B).to_dict(), "llama-8b", "widths")
    h, a, s = m.hidden_size, m.num_heads, args.tokens
    print(f"Llama-3.1-8B widths, one layer, {s:,} tokens, SDPA, bf16: bytes per token saved for backward")
    print(f"{'T':>2} {'transformers':>13} {'planner':>9} {'Megatron TP':>12} {'all-reduces fwd/bwd':>20}")
    for t in (2, 4, 8):
        found = measured(t, s)
        for tp in (1, t) if t == 2 else (t,):
            row = found[f"llama {tp}"]
            ours = activations.total(activations.layer_saved(tensor.rank_model(m, tp), activations.DTypes(2, 2), True, s))
            megatron = h * (10 + 24 / tp + 5 * a * s / (h * tp))
            fwd, bwd = row["all_reduces"]
            print(f"{tp:>2} {row['saved_per_token']:>13,.0f} {ours:>9,.0f} {megatron:>12,.0f} {f'{fwd}/{bwd}':>20}")
    whole = activations.total(activations.layer_saved(m, activations.DTypes(2, 2), True, s))
    print("\nTensor and sequence parallel, torchtitan's split of its Llama 3 block (on transformers' layer)")
    print(f"{'T':>2} {'torch-native':>13} {'planner':>9} {'Megatron SP':>12} {'gathers/scatters':>20}")
    for t in (2, 4, 8):
        row = measured(t, s, sp=True)[f"llama {t} sp"]
        ours = tensor.sequence_parallel_layer_bytes(whole, m, t, 2)
        megatron = h * 34 / t + 5 * a * s / t  # Korthikanti Eq. 5 per token, eager attention and dropout
        c = row["collectives"]
        moved = f"{c['all_gather'][0]}+{c['reduce_scatter'][0]} / {c['all_gather'][1]}+{c['reduce_scatter'][1]}"
        print(f"{t:>2} {row['saved_per_token']:>13,.0f} {ours:>9,.0f} {megatron:>12,.0f} {moved:>20}")


if __name__ == "__main__":
    main()
