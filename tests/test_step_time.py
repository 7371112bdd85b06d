"""Properties the step-time model must hold, term by term."""

import pytest

from planner.core.timing import OVERLAP_EFFICIENCY, TimeDraft, Window, step_seconds
from planner.cost import comms, overheads

from helpers import run

LLAMA = "meta-llama/Llama-3.1-8B"


def terms(r):
    return r.time.terms


def test_terms_sum_to_the_step_and_throughput_follows():
    r = run(LLAMA, "8xH100-80", sharding="fsdp", checkpointing="full", micro_batch_size=2, grad_accum=4)
    t = r.time
    assert sum(t.terms.values()) == pytest.approx(t.step_seconds)
    assert t.tokens_per_second == pytest.approx(2 * 4 * 8 * 2048 / t.step_seconds)
    assert t.tokens_per_second_per_gpu * 8 == pytest.approx(t.tokens_per_second)
    peak = 989.4e12
    assert t.mfu == pytest.approx(t.model_flops_per_token * t.tokens_per_second_per_gpu / peak)


def test_fp8_speeds_up_only_matmuls():
    bf16 = run(LLAMA, "1xH100-80", precision="bf16-mixed", optimizer="adamw-8bit", checkpointing="full")
    fp8 = run(LLAMA, "1xH100-80", precision="fp8-mixed", optimizer="adamw-8bit", checkpointing="full")
    assert terms(fp8)["matmul"] < terms(bf16)["matmul"]
    for term in ("attention", "elementwise", "loss"):
        assert terms(fp8)[term] == pytest.approx(terms(bf16)[term])


def test_full_checkpointing_adds_one_forward():
    none = run(LLAMA, "1xH200", checkpointing="none", micro_batch_size=2)
    full = run(LLAMA, "1xH200", checkpointing="full", micro_batch_size=2)
    assert terms(none)["recompute"] == 0
    layer_forward = full.time.terms["recompute"]
    # one extra forward of the layers: about a third of forward + backward matmul time
    assert layer_forward == pytest.approx(terms(full)["matmul"] / 3, rel=0.15)
    assert full.time.mfu < none.time.mfu  # recomputation is not model FLOPs


def test_ddp_all_reduce_volume_and_slowest_link():
    """Ring all-reduce sends 2(n-1)/n of the gradients per rank; across nodes the network is the
    bottleneck, inside a node NVLink."""
    assert comms.all_reduce_bytes(100, 4) == 150
    assert comms.all_gather_bytes(100, 4) == 75
    one_node = run(LLAMA, "8xH100-80", sharding="ddp", optimizer="adamw-8bit", precision="bf16-pure",
                   checkpointing="full")
    row = next(x for x in one_node.time.rows if "all-reduce" in x.label)
    psi = one_node.model.num_parameters
    nvlink = 450e9 * overheads.LINK_EFFICIENCY
    buckets = int(psi * 2 // (25 * 2**20))  # DDP bucket_cap_mb=25: one call (and its latency) per bucket
    expected = 2 * 7 / 8 * psi * 2 / nvlink + buckets * overheads.COLLECTIVE_LATENCY_INTRA_S
    assert row.raw_seconds == pytest.approx(expected, rel=0.001)
    slow = run(LLAMA, "2x8xH100-80", inter_node_gbps=100, sharding="ddp", optimizer="adamw-8bit",
               precision="bf16-pure", checkpointing="full")
    fast = run(LLAMA, "2x8xH100-80", inter_node_gbps=3200, sharding="ddp", optimizer="adamw-8bit",
               precision="bf16-pure", checkpointing="full")
    assert terms(slow)["communication"] > terms(fast)["communication"] >= 0
    assert slow.time.step_seconds > fast.time.step_seconds


def test_communication_hides_under_compute_up_to_the_window():
    r = run(LLAMA, "8xH100-80", sharding="fsdp", micro_batch_size=8)
    forward = sum(x.raw_seconds for x in r.time.rows if x.label.startswith(("forward matmuls", "attention forward",
                                                                            "norms", "cross-entropy over the vocabulary (forward)")))
    gather = next(x for x in r.time.rows if x.label == "FSDP parameter all-gather (forward)")
    assert gather.raw_seconds < OVERLAP_EFFICIENCY * forward and gather.seconds == 0


def test_a_host_bound_step_hides_communication_through_its_gaps():
    """When kernel launches, not the GPU, set a pass's length, the all-reduce runs through its
    gaps: a window is the longer of the pass's compute and its launches, so more GPU work never
    hides more communication than it costs (the eager-vs-SDPA inversions: Qwen2.5-0.5B, 1 x 512,
    on 8xH100-80 with DDP, full checkpointing and paged AdamW, and on 2x8xH100-80 with Adafactor
    and fp16, once stepped faster with eager attention than with SDPA)."""
    draft = TimeDraft()
    draft.dispatch(4.0, 6.0)
    draft.compute("matmul", "forward", 1.0, Window.FORWARD)
    draft.compute("matmul", "backward", 2.0, Window.BACKWARD)
    draft.overlapped("communication", "all-reduce", 4.0, Window.BACKWARD, per_micro_batch=False)
    # the backward lasts its 6 s of launches; 80 % of that hides the 4 s all-reduce whole
    assert step_seconds(draft, 1) == pytest.approx(10.0)
    draft.overlapped("communication", "more", 1.0, Window.BACKWARD, per_micro_batch=False)
    assert step_seconds(draft, 1) == pytest.approx(10.0 + 5.0 - OVERLAP_EFFICIENCY * 6.0)
    for gpus, config in (("8xH100-80", dict(sharding="ddp", checkpointing="full", optimizer="paged-adamw")),
                         ("2x8xH100-80", dict(sharding="ddp", optimizer="adafactor", precision="fp16-mixed"))):
        eager, sdpa = (run("Qwen/Qwen2.5-0.5B", gpus, attention=a, micro_batch_size=1, seq_len=512, **config)
                       for a in ("eager", "sdpa"))
        assert eager.time.terms["dispatch"] > sdpa.time.terms["dispatch"] > 0  # both host bound
        assert sdpa.time.tokens_per_second > eager.time.tokens_per_second, gpus
    forward = overheads.layer_forward_dispatch_seconds(False) - overheads.layer_forward_dispatch_seconds(True)
    backward = overheads.layer_backward_dispatch_seconds(False) - overheads.layer_backward_dispatch_seconds(True)
    assert (forward, backward) == pytest.approx((6 * 8e-6, 12 * 4e-6))  # 6 ops forward, 12 backward


def test_paged_state_costs_nothing_until_it_spills():
    fits = run("Qwen/Qwen2.5-0.5B", "1xH100-80", optimizer="paged-adamw")
    assert fits.paged.spilled_bytes == 0 and terms(fits)["paged_migration"] == 0
    spills = run(LLAMA, "1xA100-40", optimizer="paged-adamw", precision="bf16-pure", checkpointing="full", seq_len=512)
    host = 32e9 * overheads.PAGE_MIGRATION_LINK_FRACTION  # A100 SXM: PCIe 4 x16, per direction; on-demand migration
    assert terms(spills)["paged_migration"] == pytest.approx(2 * spills.paged.spilled_bytes / host, rel=1e-6)
    given = run(LLAMA, "1xA100-40", optimizer="paged-adamw", precision="bf16-pure", checkpointing="full", seq_len=512,
                page_migration_gb_s=20)
    assert terms(given)["paged_migration"] == pytest.approx(2 * given.paged.spilled_bytes / 20e9, rel=1e-6)


def test_offload_pays_host_traffic_and_the_cpu_step():
    r = run(LLAMA, "4xA100-80", sharding="zero2", offload="optimizer", host_memory_gb=1000)
    partition = r.model.num_parameters / 4
    assert terms(r)["cpu_optimizer_step"] == pytest.approx(partition * 4 / overheads.CPU_OPTIMIZER_PARAMS_PER_SECOND_PER_NODE)
    faster_cpu = run(LLAMA, "4xA100-80", sharding="zero2", offload="optimizer", host_memory_gb=1000,
                     cpu_optimizer_gparams_s=4)
    assert terms(faster_cpu)["cpu_optimizer_step"] == pytest.approx(partition * 4 / 4e9)
    # the H100's catalog file carries DeepSpeed's step measured beside it (1.72B params/s)
    measured = run(LLAMA, "4xH100-80", sharding="zero2", offload="optimizer", host_memory_gb=1000)
    assert terms(measured)["cpu_optimizer_step"] == pytest.approx(partition * 4 / 1.76e9)
    assert terms(r)["offload"] > 0
    assert terms(r)["optimizer_step"] == 0  # states are on the host: no GPU step
    plain = run(LLAMA, "4xA100-80", sharding="zero2", optimizer="adamw-8bit")
    assert plain.time.step_seconds < r.time.step_seconds


def test_optimizer_step_is_memory_bound():
    """Fused AdamW under autocast reads gradients and reads/writes fp32 weights and two states:
    28 bytes per parameter at the achieved HBM bandwidth; clipping reads the fp32 gradients and
    scales them in place: 12 more. torch's foreach AdamW makes 14 state-sized passes (56 bytes),
    reads the gradients twice (8) and the weights once each way (8)."""
    bandwidth = 3350e9 * 0.85
    for optimizer, step in (("adamw", 28), ("adamw-foreach", 72)):
        r = run("Qwen/Qwen2.5-0.5B", "1xH100-80", optimizer=optimizer, precision="bf16-mixed")
        psi = r.model.num_parameters
        assert terms(r)["optimizer_step"] == pytest.approx((step + 12) * psi / bandwidth, rel=0.01), optimizer
