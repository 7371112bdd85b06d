"""This machine's GPU, as a measured probe sees it: asked of a short child process, so that the
planner's own process never starts a CUDA context (which would hold device memory while the
probe runs)."""

from pydantic import ConfigDict

from planner.core.record import Record
from planner.probes.child import answer, run_child

#: What the CLI says when there is no GPU to measure on.
NO_GPU_HINT = ("The measured probe needs a CUDA GPU on this machine. Without one, use --fidelity traced "
               "(CPU, fake tensors) or planner estimate.")


class DeviceInfo(Record):
    model_config = ConfigDict(extra="forbid", frozen=True)

    available: bool
    message: str = ""
    name: str = ""
    count: int = 0
    total_bytes: int = 0
    free_bytes: int = 0
    capability: str = ""  # compute capability, e.g. "9.0"
    versions: dict[str, str | None] = {}


def local_device(timeout: float = 180.0) -> DeviceInfo:
    outcome = run_child("planner.probes.device", "{}", timeout)
    if outcome.status != "ok" or not isinstance(outcome.value, dict):
        return DeviceInfo(available=False, message=f"could not query the GPU: {outcome.describe()}")
    return DeviceInfo.model_validate(outcome.value)


def catalog_gpu(name: str, total_bytes: int) -> str:
    """The catalog id of a device the driver names ``name`` with ``total_bytes`` of memory: by
    name or alias ("NVIDIA H100 80GB HBM3", "NVIDIA H200"), else the catalog GPU whose model
    appears in the name and whose memory is within 5 %; else the driver's name itself."""
    from planner.catalog.gpus import catalog, normalize, resolve_gpu
    from planner.core.errors import PlannerInputError

    try:
        return resolve_gpu(name).id
    except PlannerInputError:
        pass
    key = normalize(name)
    for gid, f in sorted(catalog().items()):
        family = normalize(gid.split("-")[0])
        if family in key and abs(f.memory_mib * 2**20 - total_bytes) <= 0.05 * total_bytes:
            return gid
    return name


def probe_device() -> DeviceInfo:
    """This process's view of the first GPU (it starts a CUDA context: run it in a child)."""
    try:
        import torch

        from planner.probes.measured import software_versions

        versions = software_versions()
        if not torch.cuda.is_available():
            return DeviceInfo(available=False, message="no CUDA GPU is visible (torch.cuda.is_available() is "
                              f"False; torch {torch.__version__}, CUDA build {torch.version.cuda})", versions=versions)
        free, total = torch.cuda.mem_get_info(0)
        major, minor = torch.cuda.get_device_capability(0)
        return DeviceInfo(available=True, name=torch.cuda.get_device_name(0), count=torch.cuda.device_count(),
                          total_bytes=total, free_bytes=free, capability=f"{major}.{minor}", versions=versions)
    except ImportError as e:
        return DeviceInfo(available=False, message=f"torch is not installed ({e})")


def main() -> None:
    answer(probe_device().model_dump())


if __name__ == "__main__":
    main()
