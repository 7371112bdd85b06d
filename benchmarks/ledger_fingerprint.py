"""A fingerprint of the analytic model: one sha256 over every row, peak, host memory and step time
of a fixed random sample of evaluations, so a refactor that must not change any estimate can be
checked byte for byte (run it before and after; the hashes must be equal).

The sample: 5 models (Llama-3.2-1B, Mixtral-8x7B, gemma-2-2b, gpt2, Qwen2.5-0.5B) x 4 GPU specs
(1x and 8xH100-80, 2x8xH100-80, 4xA100-40) x ``--per-pair`` configurations, every technique's
values drawn at random (seed ``--seed``; on several GPUs sharding none is redrawn, on one GPU it is
kept 70 % of the time, offload none half the time), infeasible configurations' ledgers included.

    .venv/bin/python benchmarks/ledger_fingerprint.py [--per-pair 3000] [--seed 0] [--out rows.jsonl]

Prints the hash, the number of evaluations and how many are feasible; ``--out`` writes one JSON
line per evaluation, to diff when the hashes differ. 3,000 per pair (60,000 evaluations) takes
about 25 s here.
"""

import argparse
import hashlib
import json
import random

from planner.catalog.gpus import parse_gpus
from planner.catalog.models import resolve_model
from planner.engine.estimate import evaluate
from planner.strategies import REGISTRY, TrainingConfig

MODELS = ("meta-llama/Llama-3.2-1B", "mistralai/Mixtral-8x7B-v0.1", "google/gemma-2-2b", "openai-community/gpt2",
          "Qwen/Qwen2.5-0.5B")
GPUS = ("1xH100-SXM-80", "8xH100-SXM-80", "2x8xH100-SXM-80", "4xA100-40")


def sample(rng: random.Random, num_gpus: int) -> TrainingConfig:
    kw = {s.field: rng.choice(list(s.choices)) for s in REGISTRY}
    if num_gpus == 1 and rng.random() < 0.7:
        kw["sharding"] = "none"
    elif num_gpus > 1 and kw["sharding"] == "none":
        kw["sharding"] = rng.choice(["ddp", "zero2", "zero3", "fsdp"])
    if rng.random() < 0.5:
        kw["offload"] = "none"
    kw |= {"micro_batch_size": rng.choice([1, 2, 4]), "grad_accum": rng.choice([1, 1, 2]),
           "seq_len": rng.choice([512, 2048, 4096]), "fsdp_version": rng.choice([1, 2, 2]),
           "lora_rank": rng.choice([8, 16, 64])}
    return TrainingConfig(**kw)


def record(model_id: str, gpus: str, config: TrainingConfig, ev) -> str:
    rec = {"model": model_id, "gpus": gpus, "config": config.model_dump(mode="json"), "feasible": ev.feasible}
    if ev.draft is not None:
        rec |= {"peak": ev.peak, "host": ev.host, "step_seconds": ev.step_seconds,
                "rows": [(r.term, r.label, r.bytes, str(r.location), sorted(map(str, r.phases)), r.moment, r.note)
                         for r in ev.draft.rows]}
    return json.dumps(rec, sort_keys=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--per-pair", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    rng, digest, lines, feasible = random.Random(args.seed), hashlib.sha256(), [], 0
    for model_id in MODELS:
        model = resolve_model(model_id)
        for gpus in GPUS:
            hardware = parse_gpus(gpus)
            for _ in range(args.per_pair):
                config = sample(rng, hardware.num_gpus)
                ev = evaluate(model, hardware, config)
                line = record(model_id, gpus, config, ev)
                digest.update(line.encode())
                feasible += ev.feasible
                if args.out:
                    lines.append(line)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines))
    print(digest.hexdigest(), len(MODELS) * len(GPUS) * args.per_pair, feasible)


if __name__ == "__main__":
    main()
