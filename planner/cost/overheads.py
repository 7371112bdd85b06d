"""Memory that exists before and around the tensors: CUDA context, NCCL, allocator slack, host.

These are assumptions with sources (which is why they live together, here). ``planner calibrate``
replaces the CUDA context and the allocator reserve per GPU from measured probes
(GpuSpec.calibration, planner/engine/estimate.py ``runtime_reserves``); the others stay assumptions: a
measured step folds them into the fitted FLOP/s factor.
"""

from typing import TYPE_CHECKING

from planner.core.units import GIB, MIB

if TYPE_CHECKING:
    from planner.core.specs import GpuSpec

#: Per GPU whose catalog entry lacks what ``cuda_context_bytes`` needs (below): the driver's
#: reservation (nvidia-smi total minus what CUDA can allocate: H100 80GB
#: HBM3 81559 vs 81079 MiB, 0.47 GiB; A100-40GB 40960 vs 40339 MiB, 0.6 GiB), the process's CUDA
#: context with lazy module loading, and cuBLAS/cuBLASLt workspaces. Measured on an H100 (torch
#: 2.11, CUDA 13, NVML per-process bytes less the allocator's reserved bytes after training
#: steps): 0.74 GiB for one process, 0.81 GiB once a process group exists; with the driver's
#: reservation 1.21-1.28 GiB (benchmarks/results/H100-SXM-80/2026-11-26/probes.csv, context_gib; the
#: calibration fitted 1.21 GiB). Sources: that run; CUDA C Programming Guide "Lazy Loading".
CUDA_CONTEXT_BYTES = 5 * GIB // 4
#: The default per-thread stack of a CUDA context (cudaLimitStackSize), in bytes. The context
#: reserves it as local memory for every thread each SM can hold: stack x resident threads per SM
#: x SMs. Measured on an H100 (benchmarks/results/H100-SXM-80/2026-11-28-run13, smoke test
#: ``context``): the limit read 1,024 B, and raising it by 1,024 B added 264 MiB to the process,
#: exactly 1,024 x 2,048 x 132. Source: CUDA Runtime API ``cudaDeviceSetLimit`` (cudaLimitStackSize).
CUDA_STACK_BYTES_PER_THREAD = 1024
#: Resident threads per SM by compute capability. Source: CUDA C++ Programming Guide, "Compute
#: Capabilities", technical specifications ("Maximum number of resident threads per SM").
RESIDENT_THREADS_PER_SM = {"7.0": 2048, "7.2": 2048, "7.5": 1024, "8.0": 2048, "8.6": 1536, "8.7": 2048,
                           "8.9": 1536, "9.0": 2048, "10.0": 2048, "12.0": 1536}
#: What a training process holds outside the caching allocator beyond the local-memory
#: reservation: the context's own state (printf FIFO 8.25 MiB, malloc heap 8 MiB, page tables),
#: the kernels lazy loading has brought in (cuBLAS, attention, elementwise, optimizer) and library
#: handles. Measured on an H100 (torch 2.11, CUDA 13; benchmarks/results/H100-SXM-80): a process
#: held 610 MiB at context creation and 758 MiB after cross-entropy and a fused AdamW step
#: (run 13's stages), and 0.809 GiB after training steps once a process group exists (the probes'
#: context_gib, runs 1-13); less the 264 MiB of local memory, the largest, 565 MiB, is taken.
PROCESS_CONTEXT_BYTES = 565 * MIB


def context_bytes(compute_capability: str | None, sm_count: int | None, driver_reserved_bytes: int | None) -> int:
    """Device bytes per GPU that are neither the model's tensors nor the allocator's slack: the
    driver's reservation (nvidia-smi's total less what CUDA can allocate) + the context's local
    memory (CUDA_STACK_BYTES_PER_THREAD x resident threads per SM x SMs) + PROCESS_CONTEXT_BYTES.
    Unit: bytes. Assumption: kernels and handles as an H100 measured them on any GPU; a GPU whose
    entry lacks its SM count, compute capability or driver reservation takes CUDA_CONTEXT_BYTES,
    the flat H100-measured figure. Sources: the constants above."""
    threads = RESIDENT_THREADS_PER_SM.get(compute_capability or "")
    if not (threads and sm_count and driver_reserved_bytes is not None):
        return CUDA_CONTEXT_BYTES
    return driver_reserved_bytes + CUDA_STACK_BYTES_PER_THREAD * threads * sm_count + PROCESS_CONTEXT_BYTES


def cuda_context_bytes(gpu: "GpuSpec") -> int:
    """``context_bytes`` of a GPU spec (bytes)."""
    return context_bytes(gpu.compute_capability, gpu.sm_count, gpu.driver_reserved_bytes)


#: Per GPU when more than one process communicates over NVLink, PCIe peer access or the
#: network: NCCL's channel buffers in device memory and its communicator state. Each connection
#: of a channel holds one FIFO per protocol, LL 512 KiB + LL128 4.69 MiB + Simple 4 MiB = 9.19 MiB
#: (NCCL src/init.cc ``DEFAULT_LL_BUFFSIZE``, ``DEFAULT_LL128_BUFFSIZE``, ``DEFAULT_BUFFSIZE``;
#: 10 MiB once rounded to cuMem's granularity, the allocations NCCL issue #1685 logs), with a
#: ring and a tree per channel and up to 32 channels on NVSwitch. Measured there: 1.06 GB outside
#: PyTorch on each of 8 H100s after a collective, the CUDA context included (issue #1685).
#: Assumption ~0.5 GiB.
NCCL_BYTES = GIB // 2
#: Per GPU where the GPUs of a node cannot map each other's memory (``GpuSpec.peer_access``
#: False): NCCL's SHM transport keeps every channel FIFO in host shared memory (src/transport/
#: shm.cc: ``ncclShmOpen``), so the device holds only the communicator's structures and NCCL's
#: kernels. Assumption: 64 MiB.
NCCL_SHM_BYTES = 64 * MIB


def nccl_shm(gpu: "GpuSpec", nodes: int) -> bool:
    """Whether NCCL's collectives go through host shared memory (its SHM transport): inside one
    node of GPUs without peer access."""
    return nodes == 1 and not gpu.peer_access


def nccl_bytes(gpu: "GpuSpec", nodes: int) -> int:
    """NCCL's device memory per GPU of a multi-GPU job, bytes: ``NCCL_SHM_BYTES`` on the SHM
    transport (``nccl_shm``), else ``NCCL_BYTES`` (peer-to-peer or network buffers in device memory)."""
    return NCCL_SHM_BYTES if nccl_shm(gpu, nodes) else NCCL_BYTES
#: The caching allocator's reserved-but-unallocated slack, as a fraction of the allocated peak
#: (block rounding and segment splitting), beyond the holes and pools the ledger names (the
#: standard loss's 16-bit logits, strategies/loss.py; the engines' stream pools, strategies/
#: sharding.py) and for a plan whose techniques keep no pools of their own (their ``reserve``,
#: strategies/: checkpointing, adapters). Measured on an H100 with expandable segments (launch.sh's
#: setting): 0.0-0.4 % over eleven plans of Llama-3.2-1B and Qwen2.5-0.5B without checkpointing or
#: adapters (docs/measured.md: reserved less allocated peak less the named holes and pools;
#: 0.2-0.4 % for the nine with the standard loss), rounded up;
#: ``planner calibrate`` fits it per GPU. Against the world: at 49 out-of-memory errors of training
#: runs on the default allocator (no expandable segments) in public threads, the memory reserved
#: but unallocated was 1.0 % of the allocated at the median, 3.8 % at the 75th percentile and 11.9 %
#: at the 90th (benchmarks/world/oom_fragmentation.yaml, docs/world.md), so a run without expandable
#: segments may need the margin, and a few need more.
FRAGMENTATION_FRACTION = 0.005
#: Host RAM per training process: Python, torch, CUDA host libraries, pinned staging and the
#: data loader. Assumption (~3 GiB, typical RSS of a torch training process before model load).
HOST_PROCESS_BYTES = 3 * GIB
#: The fraction of a node's host RAM no plan may use: the operating system and its services, the
#: page cache that reading the checkpoint and the data fills, and the data loader's worker
#: processes beyond ``HOST_PROCESS_BYTES``, none of which the ledger counts. Assumption (a plan at
#: 78 of 80 GB leaves the kernel nothing to reclaim; Linux's OOM killer ends the largest process,
#: the trainer); ``--host-memory-gb`` gives the RAM per node, this share of it stays free.
HOST_RESERVE_PERCENT = 10
HOST_RESERVE_FRACTION = HOST_RESERVE_PERCENT / 100


def usable_host_bytes(capacity: int) -> int:
    """Host RAM per node a plan may use (bytes): ``capacity`` less ``HOST_RESERVE_PERCENT`` %,
    rounded down (integer arithmetic, so ``host_capacity_for`` is its exact inverse)."""
    return int(capacity) * (100 - HOST_RESERVE_PERCENT) // 100


def host_capacity_for(need: int) -> int:
    """The least host RAM per node (bytes) whose usable share holds ``need`` bytes."""
    return -(-int(need) * 100 // (100 - HOST_RESERVE_PERCENT))
#: The fraction of GPU memory planning keeps free by default (``--margin``), from the memory
#: model's measured error, not a guess. A plan predicted at (1 - m) of the GPU stays inside it at
#: an under-prediction e when (1 - m)(1 + e) <= 1, i.e. m >= 1 - 1/(1 + e). Issue 17's traced matrix
#: (benchmarks/traced_matrix.py, 529 cells, docs/traced-matrix.md) reads the step peak at worst
#: 0.62 % low (Phi-3-mini, fp8-mixed, eager, FSDP at 8 ranks, 1 x 8192, full depth): m >= 1 -
#: 1/1.0062 = 0.6 %. It was 6 % (5.8 % under before issue 17 fixed the activation lists), then
#: 3 % (2.35 %, Mixtral under FSDP2, before its buffers were in the ledger). On a real GPU (an
#: H100, docs/measured.md) the driver-seen peak of 30 plans (12 runs) is at worst 1.5 % above the
#: prediction (Qwen2.5-0.5B, full checkpointing, 4 x 1024: its allocator reserve; 5.2 % before the
#: loss's logits hole was in the ledger), so m >= 1.5 % in sample. It stays 3 % until a run measures
#: the model out of sample (a second GPU, multi-GPU engines at their real world size).
#: ``--margin 0`` turns it off.
DEFAULT_MARGIN = 0.03

# --- step-time constants -------------------------------------------------------------------

#: Host-side time to launch one op in eager PyTorch (Python + dispatcher + CUDA launch), and
#: ops per decoder layer (HF Llama-style layer: ~35 forward ops; autograd runs ~2x as many
#: backward nodes at a lower per-op cost). Assumptions (PyTorch dispatcher overhead is a few
#: microseconds per op: "Making Deep Learning Go Brrrr From First Principles", He 2022),
#: not fitted separately (measured steps fold them into the FLOP/s factor). They set a floor
#: on micro-batch time for small models.
DISPATCH_SECONDS_PER_OP_FORWARD = 8e-6
DISPATCH_SECONDS_PER_OP_BACKWARD = 4e-6
OPS_PER_LAYER_FORWARD = 35
OPS_PER_LAYER_BACKWARD = 70
#: Ops eager attention launches per layer beyond SDPA's one fused call: transformers'
#: ``eager_attention_forward`` runs the QK^T matmul, the scale, the mask add, an fp32 softmax,
#: the cast back, dropout and the PV matmul (7 ops for SDPA's 1); backward ~2x as many nodes, as
#: for the layer. Counted from transformers 5's llama modeling code.
EAGER_ATTENTION_EXTRA_OPS_FORWARD = 6


def layer_forward_dispatch_seconds(fused_attention: bool) -> float:
    """Host-side launch time of one decoder layer's forward, seconds (the constants above)."""
    ops = OPS_PER_LAYER_FORWARD + (0 if fused_attention else EAGER_ATTENTION_EXTRA_OPS_FORWARD)
    return ops * DISPATCH_SECONDS_PER_OP_FORWARD


def layer_backward_dispatch_seconds(fused_attention: bool) -> float:
    """Host-side launch time of one decoder layer's backward, seconds: twice the forward's ops
    (the constants above)."""
    ops = OPS_PER_LAYER_BACKWARD + (0 if fused_attention else 2 * EAGER_ATTENTION_EXTRA_OPS_FORWARD)
    return ops * DISPATCH_SECONDS_PER_OP_BACKWARD

#: Host-side cost of FSDP2's per-module hooks (gather, reshard, reduce) per decoder layer per
#: micro-batch, forward and backward: light, and launched ahead of the GPU (a dispatch floor).
#: Assumption; FSDP2 one rank of Llama-3.2-1B on an H100 stepped within 0-12 % of the same plan
#: without it (benchmarks/results/H100-SXM-80, runs 2, 4, 6).
FSDP_HOOK_SECONDS_PER_LAYER = 100e-6
#: DeepSpeed's per-module hooks on the host, seconds per decoder layer per micro-batch (forward
#: and backward, split evenly: an assumption): ZeRO-3 fetches and releases each submodule's
#: parameters from Python; ZeRO-1/2 copy each gradient into its buckets and partition. The hooks
#: queue GPU work without waiting for it (NCCL handles wait on streams, not the host), so they are
#: host time the GPU hides when its own work per layer is longer: a dispatch floor added to the
#: kernel launches (planner/core/timing.py ``resolve``), not GPU-idle time. Solved so that the floor
#: reproduces the measured steps on an H100 with a 16-CPU host (Llama-3.2-1B, 16 layers, 2 x 2048,
#: one rank, accumulation 1; benchmarks/results/H100-SXM-80): ZeRO-3 0.409 and 0.435 s (runs 4, 5),
#: median 0.422 -> 24.6 ms a layer; ZeRO-2 0.168 and 0.213 s (runs 2, 6), median 0.1905 -> 10.0 ms.
#: ZeRO-1 shares ZeRO-2's code (DeepSpeed runtime/zero/stage_1_and_2.py) and is given its figure.
#: Hidden on large layers: FlagPerf's Llama-2-7B ZeRO-3 on 8 A800s reached 47.9 % MFU
#: at 4,096 tokens a micro-batch (benchmarks/world/throughputs.yaml), impossible with 0.6 s of
#: GPU-idle hooks a step. A host with slower cores takes longer (DeepSpeed issue #5060: ZeRO-3 is
#: CPU-bound on small models).
ZERO3_HOOK_SECONDS_PER_LAYER = 24.6e-3
ZERO12_HOOK_SECONDS_PER_LAYER = 10.0e-3

#: Host-side cost of selective activation checkpointing per decoder layer per pass (the forward,
#: and the recompute in backward: the same), beyond the ops' own launches: torch's per-op policy
#: (``create_selective_checkpoint_contexts``, planner/runtime/checkpointing.py) runs every aten op
#: of the layer through a Python ``__torch_dispatch__`` mode and the policy function, and caches
#: the saved outputs. Host time the GPU hides when its own work per layer is longer (a dispatch
#: floor, like DeepSpeed's hooks). Solved so that the floor reproduces the measured step on an H100
#: with a 16-CPU host (Llama-3.2-1B, 16 layers, 2 x 2048, bf16-mixed, AdamW: 0.218, 0.198, 0.236
#: and 0.223 s in four runs, median 0.220; full checkpointing 0.154 s, none 0.123 s;
#: benchmarks/results/H100-SXM-80) -> 6.0 ms a layer a pass (0.218 s planned). One case: the
#: constant holds that case only until another size is measured. Larger layers and micro-batches
#: hide it (an 8B layer's forward at 2 x 2048 tokens is ~5 ms of GPU work, at 8 x 2048 ~17 ms).
SELECTIVE_CHECKPOINT_SECONDS_PER_LAYER = 6.0e-3

#: Host-side cost of one QLoRA module call, forward or backward, beyond its kernels' launches:
#: bitsandbytes' ``Linear4bit.forward`` Python (its quant state, the input's and bias's casts),
#: ``MatMul4Bit`` (a Python autograd Function) and ``dequantize_4bit`` (torch.library ops, the
#: absmax's own dequantization first; bitsandbytes 0.50: the backward dequantizes again), and the
#: peft LoRA layer's Python around it. A dispatch floor the GPU hides when its own work per
#: module is longer. Solved on an H100 with a 16-CPU host (benchmarks/results/H100-SXM-80):
#: Llama-3.2-1B QLoRA r16 on all linears, 2 x 2048 tokens, 112 quantized modules, 0.132 s a step
#: (median of 5 runs) -> 0.55 ms a call. One case; Llama-3.1-8B QLoRA at 2 x 2048 with full
#: checkpointing hides it (0.709 s planned, 0.742 measured in 2 runs, as without it).
NF4_MATMUL_HOST_SECONDS = 0.55e-3

#: Host-side cost of optimizers that step one parameter tensor at a time, per tensor, seconds.
#: bitsandbytes (0.50: ``Optimizer8bit.step`` calls ``sync_gpu(p)``, ``torch.cuda.synchronize()``,
#: after every tensor's update, and its Python path makes each tensor contiguous, builds its
#: config and dispatches a torch.library op) adds it to the update kernels' own time: the GPU
#: waits for the host between tensors. torchao's low-bit AdamW calls a compiled per-tensor step
#: without synchronizing: a floor the GPU hides when its own step is longer. Solved on an H100
#: with a 16-CPU host (benchmarks/results/H100-SXM-80, step time beyond the rest of the plan):
#: bitsandbytes 8-bit AdamW of Llama-3.2-1B (146 tensors) 0.26 ms a tensor (7 runs), paged 8-bit
#: 0.28 (6 runs), paged 32-bit 0.16 (5 runs), 8-bit AdamW of Llama-3.1-8B (291 tensors) 0.09
#: (1 run): 0.2 ms, between them (those four steps -7 %..+6 %; the 8B step measured from short
#: stacks +12 %); torchao 4-bit AdamW of Llama-3.2-1B 0.36 ms (4 runs; one case).
PER_TENSOR_STEP_SECONDS = {"bitsandbytes": 0.2e-3, "torchao": 0.36e-3}
#: Which of them synchronizes with the GPU after each tensor (its host time adds to the kernels').
SYNCHRONIZED_STEP = frozenset({"bitsandbytes"})

#: Achieved fraction of a link's per-direction bandwidth by NCCL collectives (nccl-tests bus
#: bandwidth: ~360-370 GB/s of NVLink4's 450, ~80% of PCIe and InfiniBand line rate).
LINK_EFFICIENCY = 0.8
#: Latency per collective call: ~10-30 us inside a node, ~50 us across nodes (nccl-tests small
#: message times). Assumption.
COLLECTIVE_LATENCY_INTRA_S = 20e-6
COLLECTIVE_LATENCY_INTER_S = 50e-6
#: Host-to-device copies from pinned memory reach ~80% of the PCIe link (CUDA bandwidthTest).
HOST_LINK_EFFICIENCY = 0.8
#: Paged optimizer state (bitsandbytes, CUDA managed memory) that spilled to host RAM migrates
#: in and back out each step at this fraction of the GPU's host link, not at a pinned copy's
#: ``HOST_LINK_EFFICIENCY``: with the GPU full, pages come in by cudaMemPrefetchAsync per parameter
#: (bitsandbytes optim/optimizer.py ``prefetch_state``, then a full synchronize) and others are
#: evicted on demand, page by page. NVIDIA's "Maximizing Unified Memory Performance in CUDA" (2017):
#: on-demand migration "almost 2x slower (5.4GB/s) than prefetching (10.9GB/s) or explicit memory
#: copy (11.4GB/s) for PCIe", i.e. 5.4 of PCIe 3 x16's 15.75 GB/s = 0.34. T. Dettmers
#: (bitsandbytes issue #962): paged optimizers "are not very efficient for large amounts of data
#: transferred. In this case offloading would be faster". An assumption, not measured on the
#: GPUs of the catalog: ``--page-migration-gb-s`` sets the rate, and a plan whose speed rests on
#: it says so.
PAGE_MIGRATION_LINK_FRACTION = 0.34
#: CPU optimizer (DeepSpeed CPU-Adam / torch on CPU) parameters updated per second per node.
#: Assumption of order from ZeRO-Offload (Ren et al. 2021, Sec. 5: CPU-Adam updates ~1B
#: parameters in under a second on a dual-socket server); not fitted separately.
CPU_OPTIMIZER_PARAMS_PER_SECOND_PER_NODE = 1.0e9
