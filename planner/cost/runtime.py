"""Memory that exists before and around the tensors: CUDA context, NCCL, allocator slack, host.

These are assumptions with sources, to be replaced per GPU and software version by the measured
calibration of issue 7 (which is why they live together, here).
"""

from planner.units import GIB

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
#: commonly 1.02-1.10 in steady training). Assumption, calibrated in issue 7.
FRAGMENTATION_FRACTION = 0.05
#: Host RAM per training process: Python, torch, CUDA host libraries, pinned staging and the
#: data loader. Assumption (~3 GiB, typical RSS of a torch training process before model load).
HOST_PROCESS_BYTES = 3 * GIB
