"""DeepSpeed's bucket settings as the job's files set them (planner/strategies/sharding.py): "auto"
is what accelerate and the Trainer fill from the hidden size, a key left out is DeepSpeed's own
default (as under accelerate's inline plugin, whose config writes none), and the reduce buckets
are GPU memory the plan counts."""

import json

import pytest
import yaml

from planner.check import CheckRequest, check
from planner.core.errors import PlannerInputError
from planner.strategies.sharding import DEEPSPEED_DEFAULTS, ZERO_KEYS, auto_buckets, deepspeed_buckets

from helpers import round_trip, round_trip_errors, run

MODEL, GPUS = "meta-llama/Llama-3.1-8B", "8xH100-80"


def test_deepspeeds_own_defaults_are_the_ones_planner_reads():
    """DeepSpeed's ZeRO config class, unset: the defaults check takes for a key a file leaves out."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    zero = DeepSpeedZeroConfig()
    assert {k: getattr(zero, f) for k, f in (("reduce_bucket_size", "reduce_bucket_size"),
                                             ("stage3_prefetch_bucket_size", "prefetch_bucket_size"),
                                             ("stage3_param_persistence_threshold", "param_persistence_threshold"),
                                             ("stage3_max_live_parameters", "max_live_parameters"))} == DEEPSPEED_DEFAULTS


def _check_ds(tmp_path, zero: dict):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": zero, "train_micro_batch_size_per_gpu": 1}))
    return check(CheckRequest(model=MODEL, gpus=GPUS, deepspeed_config=path, alternatives=0, seq_len=2048))


def test_check_reads_auto_numbers_and_deepspeeds_defaults(tmp_path):
    auto = _check_ds(tmp_path, {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                                "stage3_param_persistence_threshold": "auto"})
    c = auto.estimate.config
    assert (c.zero_reduce_bucket_size, c.zero_prefetch_bucket_size, c.zero_persistence_threshold) == (0, 0, 0)
    assert c.zero_max_live_parameters == DEEPSPEED_DEFAULTS["stage3_max_live_parameters"]
    given = _check_ds(tmp_path, {"stage": 3, "reduce_bucket_size": 2e8, "stage3_prefetch_bucket_size": 1e7,
                                 "stage3_param_persistence_threshold": 1e4, "stage3_max_live_parameters": 3e8})
    assert [getattr(given.estimate.config, f) for f in ZERO_KEYS.values()] == [200_000_000, 10_000_000, 10_000,
                                                                               300_000_000]
    left_out = _check_ds(tmp_path, {"stage": 3})
    assert [getattr(left_out.estimate.config, f) for f in ZERO_KEYS.values()] == list(DEEPSPEED_DEFAULTS.values())
    assert "DeepSpeed's default" in left_out.sources["zero_reduce_bucket_size"]
    with pytest.raises(PlannerInputError, match="reduce_bucket_size: 'big'"):
        _check_ds(tmp_path, {"stage": 2, "reduce_bucket_size": "big"})


def test_accelerates_inline_plugin_runs_deepspeeds_defaults(tmp_path):
    """accelerate's DeepSpeed plugin without a config file writes no bucket key (accelerate
    utils/dataclasses.py), so DeepSpeed's 5e8-element reduce buckets hold GPU memory: two of them
    in bf16 under ZeRO-2 with overlap_comm, 1.86 GiB, where the Trainer's "auto" holds 32 MiB."""
    path = tmp_path / "accelerate.yaml"
    path.write_text(yaml.safe_dump({"distributed_type": "DEEPSPEED", "num_processes": 8, "mixed_precision": "bf16",
                                    "deepspeed_config": {"zero_stage": 2}}))
    inline = check(CheckRequest(model=MODEL, gpus=GPUS, accelerate_config=path, alternatives=0, seq_len=2048,
                                checkpointing="full"))
    c = inline.estimate.config
    assert c.sharding == "zero2" and c.zero_reduce_bucket_size == DEEPSPEED_DEFAULTS["reduce_bucket_size"]
    auto = run(MODEL, GPUS, sharding="zero2", checkpointing="full", seq_len=2048)
    bucket = [r for r in inline.estimate.ledger if r.label.startswith("ZeRO reduce buckets")]
    assert [r.bytes for r in bucket] == [2 * 5 * 10**8 * 2]
    h = auto.model.hidden_size
    assert inline.estimate.memory["peak"] - auto.memory["peak"] >= 2 * (5 * 10**8 - h * h) * 2


def test_emitted_buckets_read_back_as_the_plan(tmp_path):
    """A plan's buckets, left to "auto" or set, are what check reads back from its files."""
    for settings in ({}, {"zero_reduce_bucket_size": 10**8, "zero_prefetch_bucket_size": 2 * 10**7,
                          "zero_persistence_threshold": 5 * 10**4, "zero_max_live_parameters": 5 * 10**8}):
        plan = run(MODEL, GPUS, sharding="zero3", checkpointing="full", **settings)
        assert round_trip_errors(plan, round_trip(plan, tmp_path / str(len(settings)))) == []
        assert deepspeed_buckets(4096, plan.config)["reduce_bucket_size"] == (settings.get("zero_reduce_bucket_size")
                                                                             or auto_buckets(4096)["reduce_bucket_size"])
