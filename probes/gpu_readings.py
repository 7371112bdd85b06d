"""What a GPU's memory holds, read four ways at one instant (the measured probe's readings).

A peak has several readings, and they disagree exactly where "the estimate said it fits" goes
wrong, so a probe records all of them together:
- ``nvml_process``: the bytes the driver attributes to this process (NVML's per-process
  ``usedGpuMemory``, else ``nvidia-smi --query-compute-apps``): the CUDA context, the caching
  allocator's segments, library workspaces, but not CUDA managed (unified) pages;
- ``device_used``: the device's total less its free memory (``cudaMemGetInfo``), every process
  and the driver's own reservation included, and managed pages resident on the device. Measured
  on an H100 (benchmarks/results/H100-SXM-80/2026-11-26): a paged 32-bit AdamW's 9.21 GiB of state showed as
  9.26 GiB more device-used than NVML's per-process figure, 8-bit's 2.30 GiB as 2.38 GiB;
- ``reserved`` / ``allocated``: the caching allocator's reserved segments and its live tensors
  (``torch.cuda.memory_reserved`` / ``memory_allocated``), which see no managed memory;
- ``paged``: bitsandbytes' paged optimizer state (``cudaMallocManaged`` buffers its page manager
  lists), wherever its pages are; 0 when bitsandbytes is not loaded.

Reading NVML costs about a millisecond; the probe reads after a step's timer stops.
"""

import os
import subprocess
import sys

#: The readings' names, in the order the probe's CSV lists them.
READINGS = ("nvml_process", "device_used", "reserved", "allocated", "paged")


def process_device_bytes(device_used_before: int | None) -> tuple[int | None, str]:
    """Device memory the driver sees this process use, in bytes, and how it was read: NVML per
    process, nvidia-smi per process, or the device's used memory less ``device_used_before``
    (containers whose PID namespace hides the process from the driver)."""
    used = nvml_process_bytes()
    if used is not None:
        return used
    if device_used_before is not None:
        import torch

        free, total = torch.cuda.mem_get_info()
        return total - free - device_used_before, "device used less before"
    return None, ""


def nvml_process_bytes() -> tuple[int, str] | None:
    """This process's bytes as the driver reports them (NVML, else nvidia-smi), or None."""
    pid = os.getpid()
    try:
        import pynvml

        pynvml.nvmlInit()
        for i in range(pynvml.nvmlDeviceGetCount()):
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i)):
                if proc.pid == pid and proc.usedGpuMemory:
                    return int(proc.usedGpuMemory), "nvml"
    except Exception:  # not installed, or no NVML: the next reading
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
        for line in out.splitlines():
            fields = [f.strip() for f in line.split(",")]
            if len(fields) == 2 and fields[0] == str(pid) and fields[1].isdigit():
                return int(fields[1]) << 20, "nvidia-smi"
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def device_used_bytes() -> int | None:
    """The first GPU's used memory from nvidia-smi (the parent's reading before a probe starts;
    it starts no CUDA context)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
        return int(out.splitlines()[0]) << 20 if out else None
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def paged_bytes() -> int:
    """Bytes of bitsandbytes' paged (managed-memory) optimizer buffers in this process: the page
    manager lists every buffer a paged optimizer allocates (bitsandbytes/optim/optimizer.py
    ``get_state_buffer``); smaller states (< 1e5 elements) are ordinary device tensors."""
    functional = sys.modules.get("bitsandbytes.functional")
    if functional is None:
        return 0
    return sum(t.nbytes for t in functional.GlobalPageManager.get_instance().paged_tensors)


def unified_resident_bytes(readings: dict[str, dict[str, int | None]]) -> int:
    """Bytes of paged (managed) optimizer state resident on the device at the peak reading: how
    much more the device-wide reading grew than the per-process one since the start (only
    managed pages are in the one and not the other), at most the paged state's size; 0 without
    paged state or a reading."""
    peak, start = readings.get("peak") or {}, readings.get("start") or {}
    values = [peak.get("paged"), peak.get("device_used"), peak.get("nvml_process"), start.get("device_used"),
              start.get("nvml_process")]
    present = [v for v in values if v is not None]
    if not values[0] or len(present) != len(values):
        return 0
    paged, used, own, used0, own0 = present
    return max(0, min(paged, (used - own) - (used0 - own0)))


def snapshot() -> dict[str, int | None]:
    """The five readings now (after the device's queued work finishes), in bytes."""
    import torch

    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    nvml = nvml_process_bytes()
    return {"nvml_process": nvml[0] if nvml else None, "device_used": total - free,
            "reserved": torch.cuda.memory_reserved(), "allocated": torch.cuda.memory_allocated(),
            "paged": paged_bytes()}
