"""Tensor-parallel ranks traced against planner's ledger, phase by phase (issue 39).

A tiny Llama (h 256, 4 layers, V 4096: the vocabulary a large share of it, as at 1B parameters) is
traced by the traced probe as transformers loads a tensor-parallel plan (its plan on the tp mesh,
its own FSDP2 units on the fsdp mesh, under a fake process group: probes/model_setup.py
``distributed_model``), untied and tied, at TP 2 and 4 over FSDP2 2, without and with full
checkpointing, beside the same model under FSDP2 alone. Prints each phase's planner and traced
bytes (its GPU rows but the context and the allocator's reserve) and the error.

    python benchmarks/tp_traced.py [--tokens 128] [--micro-batch 2]
"""

import argparse
import json
import tempfile
from pathlib import Path

TINY = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 4096, "torch_dtype": "float32"}
LAYOUTS = ((2, 2), (4, 2), (1, 4))  # (tensor degree, FSDP degree)


def main() -> None:
    from planner.probes.compare import compare_result
    from planner.probes.traced import TraceRequest, trace_many
    from planner.strategies import TrainingConfig

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=2)
    args = ap.parse_args()
    cases = []
    for tied in (False, True):
        for t, d in LAYOUTS:
            for ckpt in ("none", "full"):
                tp = {"tensor_parallel": "transformers", "tp_size": t} if t > 1 else {}
                c = TrainingConfig(sharding="fsdp", precision="bf16-mixed", micro_batch_size=args.micro_batch,
                                   seq_len=args.tokens, checkpointing=ckpt, **tp)
                config = TINY | {"max_position_embeddings": args.tokens, "tie_word_embeddings": tied}
                cases.append((f"{'tied' if tied else 'untied'} {f'TP {t} x ' if t > 1 else ''}FSDP {d} {ckpt}",
                              config, c, t * d))
    results = trace_many([TraceRequest(config_json=cfg, config=c, world_size=w) for _, cfg, c, w in cases], workers=2)
    print(f"tiny Llama (h 256, 4 layers, V 4096), bf16-mixed, {args.micro_batch} x {args.tokens} tokens; "
          "bytes per rank, planner vs traced")
    print(f"{'plan (checkpointing)':27s} {'phase':13s} {'planner':>12s} {'traced':>12s} {'error':>8s}")
    with tempfile.TemporaryDirectory() as tmp:
        for (words, config, c, world), traced in zip(cases, results, strict=True):
            if isinstance(traced, str):
                print(f"{words:27s} failed: {traced[:200]}")
                continue
            path = Path(tmp) / "config.json"
            path.write_text(json.dumps(config))
            for term in compare_result(str(path), c, world, None, traced).terms:
                if term.term.endswith("phase"):
                    phase = term.term.removesuffix("_phase")
                    print(f"{words:27s} {phase:13s} {term.analytic:12,d} {term.traced:12,d} {term.error:+8.2%}")


if __name__ == "__main__":
    main()
