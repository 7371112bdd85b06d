"""Memory that exists before and around the tensors: CUDA context, NCCL, allocator slack, host.

These are assumptions with sources (which is why they live together, here). ``planner calibrate``
replaces the CUDA context and the allocator reserve per GPU from measured probes
(GpuSpec.calibration, planner/engine/estimate.py ``runtime_reserves``); the others stay assumptions: a
measured step folds them into the fitted FLOP/s factor.
"""

from planner.core.units import GIB

#: Per GPU: the driver's reservation (nvidia-smi total minus what CUDA can allocate: A100-40GB
#: 40960 vs 40339 MiB, ~0.6 GiB), the process's CUDA context with lazy module loading
#: (~0.3-0.5 GiB, CUDA 11.7+ CUDA_MODULE_LOADING=LAZY) and cuBLAS/cuBLASLt workspaces.
#: Sources: CUDA C Programming Guide "Lazy Loading"; torch.cuda memory notes
#: (https://pytorch.org/docs/stable/notes/cuda.html), nvidia-smi/deviceQuery readings.
CUDA_CONTEXT_BYTES = 1 * GIB
#: Per GPU when more than one process communicates: NCCL channel buffers
#: (NCCL_BUFFSIZE 4 MiB per channel and peer) and communicator state. Source: NCCL docs,
#: environment variables NCCL_BUFFSIZE / NCCL_MAX_NCHANNELS; assumption ~0.5 GiB.
NCCL_BYTES = GIB // 2
#: The caching allocator's reserved-but-unallocated slack, as a fraction of the allocated peak
#: (block rounding and segment splitting; torch.cuda memory_stats reserved vs allocated is
#: commonly 1.02-1.10 in steady training). Assumption; ``planner calibrate`` fits it per GPU.
FRAGMENTATION_FRACTION = 0.05
#: Host RAM per training process: Python, torch, CUDA host libraries, pinned staging and the
#: data loader. Assumption (~3 GiB, typical RSS of a torch training process before model load).
HOST_PROCESS_BYTES = 3 * GIB
#: The fraction of GPU memory planning keeps free by default (``--margin``), from the memory
#: model's measured error, not a guess. A plan predicted at (1 - m) of the GPU stays inside it at
#: an under-prediction e when (1 - m)(1 + e) <= 1, i.e. m >= 1 - 1/(1 + e). Issue 17's traced matrix
#: (benchmarks/traced_matrix.py, 529 cells, docs/traced-matrix.md) reads the step peak at worst
#: 0.62 % low (Phi-3-mini, fp8-mixed, eager, FSDP at 8 ranks, 1 x 8192, full depth): m >= 1 -
#: 1/1.0062 = 0.6 %. It was 6 % (5.8 % under before issue 17 fixed the activation lists), then
#: 3 % (2.35 %, Mixtral under FSDP2, before its buffers were in the ledger). It stays 3 %: the
#: rest covers what a trace cannot show and no GPU run has yet measured against it (issue 20:
#: kernel workspaces, the allocator beyond its fragmentation reserve). The CUDA context and the
#: allocator reserve are ledger rows already (a GPU run's own differences are measured by
#: ``planner calibrate``).
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

#: Host-side cost of the sharding engines' per-module hooks (gather, reshard, reduce) per decoder
#: layer per micro-batch, forward and backward. FSDP2's hooks are light; DeepSpeed ZeRO-3
#: fetches and releases parameters from Python per submodule. Assumptions (DeepSpeed ZeRO-3 is
#: widely reported as CPU-bound on small models, e.g. DeepSpeed issue #5060 and its "ZeRO-3
#: overheads" notes); not fitted separately.
FSDP_HOOK_SECONDS_PER_LAYER = 100e-6
ZERO3_HOOK_SECONDS_PER_LAYER = 400e-6

#: Achieved fraction of a link's per-direction bandwidth by NCCL collectives (nccl-tests bus
#: bandwidth: ~360-370 GB/s of NVLink4's 450, ~80% of PCIe and InfiniBand line rate).
LINK_EFFICIENCY = 0.8
#: Latency per collective call: ~10-30 us inside a node, ~50 us across nodes (nccl-tests small
#: message times). Assumption.
COLLECTIVE_LATENCY_INTRA_S = 20e-6
COLLECTIVE_LATENCY_INTER_S = 50e-6
#: Host-to-device copies from pinned memory reach ~80% of the PCIe link (CUDA bandwidthTest).
HOST_LINK_EFFICIENCY = 0.8
#: CPU optimizer (DeepSpeed CPU-Adam / torch on CPU) parameters updated per second per node.
#: Assumption of order from ZeRO-Offload (Ren et al. 2021, Sec. 5: CPU-Adam updates ~1B
#: parameters in under a second on a dual-socket server); not fitted separately.
CPU_OPTIMIZER_PARAMS_PER_SECOND_PER_NODE = 1.0e9
