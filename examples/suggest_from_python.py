"""Search from Python: the same result `planner suggest --json` prints.

    python examples/suggest_from_python.py
"""

from planner.engine.suggest import suggest
from planner.schema.suggest import SuggestRequest

result = suggest(SuggestRequest(model="meta-llama/Llama-3.1-8B", gpus="8xH100-80", margin=0.05, top=3))
print(f"{result.considered:,} candidates, {sum(result.rejected.values()):,} rejected")
for plan in result.plans:
    c = plan.config
    print(f"{c.optimizer:18s} {c.precision:10s} {c.sharding:6s} ckpt {c.checkpointing:9s} mbs {c.micro_batch_size} "
          f"x accum {c.grad_accum}: {plan.time.tokens_per_second:,.0f} tokens/s, "
          f"peak {plan.memory['peak'] / 2**30:.1f} GiB")
