"""Published tensor-parallel measurements against planner (issue 39).

Reads benchmarks/world/tensor_parallel.yaml (each row with its source, quote, hardware, exact
config and caveat) and prints the rows planner can set beside its own figures:
- **throughput**: torchtitan's bf16 rows (vanilla and async TP, FSDP2 x TP 8 on H100s), estimated as
  the nearest plan planner models: transformers' TP (no sequence parallelism), FSDP2 over the rest,
  bf16-mixed, the row's micro-batch, sequence 8,192 (torchtitan's Llama 3 default: the file does not
  state it), the row's checkpointing (full, or planner's selective for torchtitan's per-op SAC: the
  same policy), H100-SXM-80
  (theirs: H100 96 GB HBM2e at 500 W);
- **activations**: Korthikanti et al. 2022's per-layer formulas (Megatron: what a GPT block saves at
  TP t, with and without sequence parallelism) beside what planner counts for transformers' TP of
  Llama-3.1-8B (benchmarks/tp_activations.py prints the same per degree).
Rows planner cannot set beside its model (float8, pipeline or context parallelism, Megatron's GPT
models with their own kernels) are counted, not compared.

    python benchmarks/tp_world.py
"""

from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
MODELS = {"Llama 3 8B": "meta-llama/Llama-3.1-8B", "Llama 3 70B": "meta-llama/Llama-3.1-70B"}
SEQ = 8192  # torchtitan's Llama 3 training default (train_configs/llama3_*.toml ``seq_len``)


def rows() -> list[dict]:
    return yaml.safe_load((HERE / "world" / "tensor_parallel.yaml").read_text())


def comparable_throughput(row: dict) -> bool:
    return (row["metric"] == "tokens_per_s_per_gpu" and row.get("precision") == "bf16"
            and row.get("sharding") == "fsdp+tp" and not row.get("pp_size") and not row.get("cp_size")
            and any(row["model"].startswith(k) for k in MODELS))


def planner_tokens(row: dict) -> tuple[float, float]:
    """(tokens/s per GPU, peak GiB) planner estimates for the row's nearest plan (module docstring)."""
    from planner.catalog.gpus import parse_gpus
    from planner.catalog.models import resolve_model
    from planner.engine.estimate import estimate_config
    from planner.strategies import TrainingConfig

    model = next(v for k, v in MODELS.items() if row["model"].startswith(k))
    hw = row["hardware"]
    checkpointing = "selective" if str(row.get("checkpointing")).startswith("selective (per-op") else "full"
    config = TrainingConfig(sharding="fsdp", precision="bf16-mixed", checkpointing=checkpointing,
                            micro_batch_size=row["micro_batch_size"], seq_len=SEQ, tensor_parallel="transformers",
                            tp_size=row["tp_size"])
    result = estimate_config(resolve_model(model), parse_gpus(f"{hw['nodes']}x{hw['gpus_per_node']}xH100-80"), config)
    return result.time.tokens_per_second_per_gpu, result.memory["peak"] / 2**30


def main() -> None:
    from planner.catalog.models import resolve_model
    from planner.cost import activations, tensor

    data = rows()
    print(f"{len(data)} published rows (benchmarks/world/tensor_parallel.yaml)\n")
    print("Throughput: torchtitan bf16, FSDP2 x TP (theirs: TP with sequence parallelism, loss parallel,")
    print("torch.compile; no memory published: planner's peak, its logits gathered whole, does not fit)")
    print(f"{'row (tokens/s per GPU)':44s} {'published':>9s} {'planner':>8s} {'ratio':>6s} {'peak GiB':>8s}")
    compared = [r for r in data if comparable_throughput(r)]
    for r in compared:
        tps, peak = planner_tokens(r)
        print(f"{r['id'][:44]:44s} {r['value']:9,.0f} {tps:8,.0f} {tps / r['value']:6.2f} {peak:8.1f}")
    print("\nActivations a layer saves, bytes per token (16-bit, flash attention: no saved scores). Megatron:")
    print("a GPT block (Korthikanti et al. 2022: 10h + 24h/t with TP, 34h/t with TP + SP, their 5as/h score")
    print("terms left out); planner: transformers' TP of Llama-3.1-8B (h 4,096, MLP 14,336, GQA), as traced")
    m = resolve_model("meta-llama/Llama-3.1-8B")
    h = m.hidden_size
    print(f"{'t':>3s} {'Megatron TP':>12s} {'Megatron TP+SP':>15s} {'planner':>9s} {'planner/TP':>11s}")
    for t in (1, 2, 4, 8):
        ours = activations.total(activations.layer_saved(tensor.rank_model(m, t), activations.DTypes(2, 2), True, SEQ))
        megatron = h * (10 + 24 / t)
        print(f"{t:3d} {megatron:12,.0f} {34 * h / t:15,.0f} {ours:9,.0f} {ours / megatron:11.2f}")
    formulas = sum(r["metric"] == "activation_bytes_formula" for r in data)
    print(f"\nnot compared: {len(data) - len(compared) - formulas} rows (float8, pipeline or context parallelism, Megatron's "
          "GPT models with their own kernels and MFU/TFLOP/s definitions)")


if __name__ == "__main__":
    main()
