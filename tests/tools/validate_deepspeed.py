"""Validate DeepSpeed JSON files with DeepSpeed's own DeepSpeedConfig at a given world size.

    python tests/tools/validate_deepspeed.py '[["path.json", 8, 4096], ...]'

One rank of a fake process group of that world size (torch's FakeStore backend: no network,
no GPU) stands in for the job, so DeepSpeed checks train_batch_size = micro x accum x world the
way it would at launch; the buckets left "auto" are filled from the model's hidden size first,
as accelerate and the Trainer fill them. Prints one JSON object per file.
"""

import json
import sys

import deepspeed.comm as ds_dist
import torch.distributed as dist
from deepspeed.runtime.config import DeepSpeedConfig
from torch.testing._internal.distributed.fake_pg import FakeStore

results = []
AUTO_BY_HIDDEN = {"reduce_bucket_size": lambda h: h * h, "stage3_prefetch_bucket_size": lambda h: int(0.9 * h * h),
                  "stage3_param_persistence_threshold": lambda h: 10 * h}  # (transformers integrations/deepspeed.py)

for path, world, hidden in json.loads(sys.argv[1]):
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    ds_dist.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    try:
        with open(path) as f:
            config = json.load(f)
        zero = config.get("zero_optimization", {})
        buckets = {k: fill(hidden) for k, fill in AUTO_BY_HIDDEN.items() if zero.get(k) == "auto"}
        config["zero_optimization"] = zero | buckets
        cfg = DeepSpeedConfig(config)
        results.append({
            "path": path, "ok": True, "world_size": cfg.world_size, "stage": cfg.zero_optimization_stage,
            "train_batch_size": cfg.train_batch_size, "micro": cfg.train_micro_batch_size_per_gpu,
            "accum": cfg.gradient_accumulation_steps, "bf16": cfg.bfloat16_config.enabled,
            "fp16": cfg.float16_config.enabled,
            "offload_optimizer": str(cfg.zero_config.offload_optimizer.device) if cfg.zero_config.offload_optimizer else None,
            "offload_param": str(cfg.zero_config.offload_param.device) if cfg.zero_config.offload_param else None,
            "auto_buckets": sorted(buckets), "reduce_bucket_size": cfg.zero_config.reduce_bucket_size,
        })
    except Exception as e:  # report, the test asserts
        results.append({"path": path, "ok": False, "error": repr(e)})
    dist.destroy_process_group()
print(json.dumps(results))
