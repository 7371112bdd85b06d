"""Estimate one configuration from Python, the same result object `planner estimate --json` prints.

    python examples/estimate_from_python.py
"""

from planner.core.formatting import gib
from planner.engine.estimate import estimate
from planner.schema.estimate import EstimateRequest

result = estimate(
    EstimateRequest(
        model="meta-llama/Llama-3.1-8B",
        gpus="8xH100-80",
        optimizer="adamw",
        precision="bf16-mixed",
        sharding="fsdp",
        checkpointing="full",
        micro_batch_size=4,
        seq_len=4096,
    )
)
print(f"fits: {result.fits}  peak {gib(result.memory['peak'])} of {gib(result.hardware.gpu_memory_bytes)}")
for term, n_bytes in result.memory.items():
    if n_bytes and term != "peak":
        print(f"  {term:28s} {gib(n_bytes)}")
print("\n".join(result.reasons))
