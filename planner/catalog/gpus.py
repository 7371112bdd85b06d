"""GPU catalog (data/gpus/*.yaml) and the ``--gpus`` grammar.

    GPUS := [NODES "x"] [GPUS_PER_NODE "x"] GPU
    GPU  := a catalog id or alias (case-insensitive), or a path to a GPU YAML file

``1xA100-40`` is one A100, ``8xH100-80`` one node of eight, ``4x8xH100-80`` four nodes of eight.
Two readings come with a note (HardwareSpec.notes), not a refusal: a name several catalog GPUs
share ("A100": the 80 GB SXM card, by its alias; the 40 GB and PCIe cards are A100s too), and more
GPUs in one node than the catalog's usual maximum (up to ``MAX_GPUS_PER_NODE``).
"""

import difflib
import re
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator

from planner.catalog import DATA_DIR, calibration
from planner.catalog.efficiency import efficiency
from planner.catalog.files import read_mapping
from planner.core import shell
from planner.core.errors import PlannerInputError
from planner.core.record import Record
from planner.core.specs import GpuSpec, HardwareSpec, HostRateSpec
from planner.core.units import GB, MIB, TERA

GPU_DIR = DATA_DIR / "gpus"
GRAMMAR = "[NODES x] [GPUS_PER_NODE x] GPU, e.g. 1xA100-40, 8xH100-80, 4x8xH100-80, or 2x./my-gpu.yaml"
_SPEC = re.compile(r"^\s*(?:(\d+)\s*[x×*]\s*)?(?:(\d+)\s*[x×*]\s*)?(\S.*?)\s*$", re.IGNORECASE | re.DOTALL)
#: Default host RAM per node when --host-memory-gb is not given: twice the node's GPU memory,
#: at least 64 GB. Assumption matching common cloud shapes (Colab A100: 83 GB for 40 GB of GPU;
#: p4d 8xA100-40: 1152 GiB; p5 8xH100: 2 TiB); pass --host-memory-gb for your machine.
DEFAULT_HOST_MEMORY_FACTOR = 2
DEFAULT_HOST_MEMORY_MIN_BYTES = 64 * GB
#: GPUs per node beyond the catalog's max_gpus_per_node are taken with a note up to this many
#: (a DGX-2 holds 16); more in one node is refused as a likely slip for NODES x GPUS.
MAX_GPUS_PER_NODE = 16
#: Default network between nodes when --inter-node-gbps is not given: 200 Gbit/s per GPU
#: (DGX A100: 8 x 200 Gb/s HDR per node; DGX H100 has 8 x 400 Gb/s NDR; cloud nodes often less).
DEFAULT_INTER_NODE_GBPS_PER_GPU = 200


class _Link(Record):
    model_config = ConfigDict(extra="forbid")
    kind: str
    gb_per_s: float = Field(gt=0)


class _MeasuredHost(Record):
    """Host-side rates measured beside this GPU (its ``sources.measured_host`` says where):
    parameters a second (billions) the CPU optimizer step updates inside each engine, and the
    paged state's round trip in GB/s."""

    model_config = ConfigDict(extra="forbid")
    cpu_optimizer_gparams_s: dict[Literal["deepspeed", "fsdp"], float] = {}
    page_migration_gb_s: float | None = Field(None, gt=0)

    @field_validator("cpu_optimizer_gparams_s")
    @classmethod
    def _positive(cls, v: dict[str, float]) -> dict[str, float]:
        if any(not rate > 0 for rate in v.values()):
            raise ValueError("rates must be positive")
        return v


class GpuFile(Record):
    """The schema of one GPU YAML file (catalog or user)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    name: str
    aliases: list[str] = []
    vendor: str
    architecture: str
    compute_capability: str | None = None
    memory_mib: int = Field(gt=0)  # total as nvidia-smi reports it
    memory_bandwidth_gb_per_s: float = Field(gt=0)
    dense_tflops: dict[str, float | None]
    gpu_link: _Link
    host_link: _Link
    max_gpus_per_node: int = Field(8, ge=1)
    sm_count: int | None = Field(None, gt=0)  # streaming multiprocessors (the context's local memory)
    driver_reserved_mib: int | None = Field(None, ge=0)  # nvidia-smi's total less CUDA's total
    peer_access: bool = True  # two GPUs of a node can map each other's memory (CUDA P2P)
    measured_host: _MeasuredHost | None = None
    sources: dict[str, str] = {}

    @field_validator("dense_tflops")
    @classmethod
    def _fp32_peak(cls, v: dict[str, float | None]) -> dict[str, float | None]:
        """Every GPU has a positive fp32 peak: the rate of a dtype it lacks falls back to it."""
        fp32 = v.get("fp32")
        if fp32 is None or not fp32 > 0:
            raise ValueError("needs a positive fp32 peak (dense_tflops: {fp32: TFLOP/s, ...})")
        return v

    @field_validator("id", "name", "vendor", "architecture")
    @classmethod
    def _one_line(cls, v: str) -> str:
        """Names reach screens, PLAN.md and launch.sh comments: one line of printable text."""
        if not v.strip() or any(shell.unsafe(c) for c in v):
            raise ValueError(f"must be one line of printable text, not {shell.visible(v)}")
        return v

    @property
    def driver_reserved_bytes(self) -> int | None:
        return None if self.driver_reserved_mib is None else self.driver_reserved_mib * MIB

    def to_spec(self, calibration_store: Path | None = None) -> GpuSpec:
        """The GPU in base units with its catalog efficiency, and the corrections ``planner calibrate``
        saved for it in ``calibration_store`` (a store file; None: the assumptions only)."""
        flops = {k: (v * TERA if v is not None else None) for k, v in self.dense_tflops.items()}
        for dtype in ("fp32", "tf32", "fp16", "bf16", "fp8"):
            flops.setdefault(dtype, None)
        spec = GpuSpec(
            id=self.id,
            name=self.name,
            vendor=self.vendor,
            architecture=self.architecture,
            compute_capability=self.compute_capability,
            memory_bytes=self.memory_mib * MIB,
            memory_bandwidth_bytes_per_s=self.memory_bandwidth_gb_per_s * GB,
            dense_flops_per_s=flops,
            gpu_link_kind=self.gpu_link.kind,
            gpu_link_bytes_per_s=self.gpu_link.gb_per_s * GB,
            host_link_kind=self.host_link.kind,
            host_link_bytes_per_s=self.host_link.gb_per_s * GB,
            max_gpus_per_node=self.max_gpus_per_node,
            sm_count=self.sm_count,
            driver_reserved_bytes=self.driver_reserved_bytes,
            peer_access=self.peer_access,
            sources=self.sources,
            efficiency=efficiency(self.id, self.architecture),
            host_rates=self._host_rates(),
        )
        return calibration.apply(spec, calibration.corrections_in(calibration_store, self.id))


    def _host_rates(self) -> HostRateSpec | None:
        host = self.measured_host
        if host is None:
            return None
        where = self.sources.get("measured_host", f"the GPU file of {self.id}")
        cpu = {engine: rate * 1e9 for engine, rate in host.cpu_optimizer_gparams_s.items()}
        sources = {f"cpu_optimizer:{engine}": where for engine in cpu}
        if host.page_migration_gb_s is not None:
            sources["page_migration"] = where
        return HostRateSpec(cpu_optimizer_params_per_s=cpu, sources=sources,
                            page_migration_bytes_per_s=host.page_migration_gb_s * GB if host.page_migration_gb_s else None)


def normalize(name: str) -> str:
    """Spelling-insensitive key: lowercase, no 'nvidia', no trailing 'gb', alphanumerics only."""
    s = name.lower().replace("nvidia", "")
    s = re.sub(r"[^a-z0-9]", "", s)
    return s[:-2] if s.endswith("gb") else s


def _read(path: Path) -> GpuFile:
    data = read_mapping(path, "GPU file", hint=_yaml_hint())
    try:
        return GpuFile.model_validate(data)
    except ValidationError as e:
        problems = [f"{path}: {'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()]
        raise PlannerInputError(problems, hint=_yaml_hint()) from None


def _yaml_hint() -> str:
    example = GPU_DIR / "a100-sxm-40.yaml"
    return f"A GPU file has the keys of the catalog files, for example {example}"


@cache
def catalog() -> dict[str, GpuFile]:
    """Every catalog GPU by id."""
    files = [_read(p) for p in sorted(GPU_DIR.glob("*.yaml"))]
    return {f.id: f for f in files}


@cache
def _index() -> dict[str, str]:
    index: dict[str, str] = {}
    for gid, f in catalog().items():
        for name in [gid, *f.aliases]:
            index[normalize(name)] = gid
    return index


def _is_file(name: str) -> bool:
    if name.lower().endswith((".yaml", ".yml")):
        return True
    try:
        return Path(name).is_file()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte: not a file
        return False


def _tokens(name: str) -> tuple[str, ...]:
    """A name's words: "NVIDIA A100-SXM4-80GB" -> ("a100", "sxm4", "80")."""
    words = re.split(r"[^a-z0-9]+", name.lower().replace("nvidia", ""))
    return tuple(w[:-2] if w.endswith("gb") and w[:-2].isdigit() else w for w in words if w)


@cache
def _also_named() -> dict[str, tuple[str, ...]]:
    """Normalized name -> the other catalog GPUs whose names extend it, for names that state no
    memory size: "a100" is the A100-SXM-80's alias, and A100-SXM-40, A100-PCIE-40 and A100-PCIE-80
    are A100s too. A name with its size ("a100-40", "h100-80") is taken as meant."""
    names = {gid: [_tokens(n) for n in (gid, *f.aliases)] for gid, f in catalog().items()}
    out: dict[str, set[str]] = {}
    for gid, f in catalog().items():
        for name in (gid, *f.aliases):
            words = _tokens(name)
            if any(w.isdigit() for w in words[1:]):
                continue
            others = {o for o, theirs in names.items() if o != gid
                      and any(len(t) > len(words) and t[: len(words)] == words for t in theirs)}
            if others:
                out.setdefault(normalize(name), set()).update(others)
    order = {gid: (f.memory_mib, gid) for gid, f in catalog().items()}
    return {k: tuple(sorted(v, key=order.__getitem__)) for k, v in out.items()}


def gpu_notes(name: str) -> list[str]:
    """What a user should know about how ``name`` was read: a name several catalog GPUs share."""
    key = normalize(name)
    others = _also_named().get(key)
    if not others:
        return []
    gid = _index()[key]
    listed = ", ".join(others[:-1]) + (" or " if len(others) > 1 else "") + others[-1]
    return [f"{name} taken as {gid} ({catalog()[gid].name}); write {listed} for "
            + ("another card" if len(others) > 1 else "the other card")]


def resolve_gpu(name: str, calibration_store: Path | None = None) -> GpuSpec:
    """A catalog GPU by id or alias, or a user YAML file, with the corrections in
    ``calibration_store`` (GpuFile.to_spec)."""
    if _is_file(name):
        path = Path(name).expanduser()
        if not path.is_file():
            raise PlannerInputError(f"GPU file not found: {path}", hint=_yaml_hint())
        return _user_gpu(_read(path), path.resolve(), calibration_store)
    gid = _index().get(normalize(name))
    if gid is None:
        close = difflib.get_close_matches(normalize(name), list(_index()), n=4, cutoff=0.5)
        ids = sorted({_index()[c] for c in close})
        hint = f"Did you mean: {', '.join(ids)}?\n" if ids else ""
        raise PlannerInputError(
            f"unknown GPU {name!r}",
            hint=f"{hint}Known GPUs: {', '.join(sorted(catalog()))}.\n"
            f"For another GPU, pass a YAML file. Grammar: {GRAMMAR}",
        )
    return catalog()[gid].to_spec(calibration_store)


def _user_gpu(f: GpuFile, path: Path | str, calibration_store: Path | None) -> GpuSpec:
    """A user GPU file's GPU, carrying where it came from and what it said (GpuSpec.definition)."""
    spec = f.to_spec(calibration_store)
    return spec.model_copy(update={"file": str(path), "definition": f.model_dump(mode="json")})


def _defined_gpu(definition: dict, name: str, calibration_store: Path | None) -> GpuSpec:
    """The GPU a plan file defines (a user GPU file's content, as planned): no file is read."""
    try:
        f = GpuFile.model_validate(definition)
    except ValidationError as e:
        problems = [f"the plan's GPU definition ({name}): {'.'.join(map(str, err['loc']))}: {err['msg']}"
                    for err in e.errors()]
        raise PlannerInputError(problems, hint="Re-plan with the GPU file, or pass --gpus with a catalog GPU.") from None
    return _user_gpu(f, name, calibration_store)


def default_host_memory_bytes(gpu: GpuSpec, gpus_per_node: int) -> int:
    return max(DEFAULT_HOST_MEMORY_MIN_BYTES, DEFAULT_HOST_MEMORY_FACTOR * gpus_per_node * gpu.memory_bytes)


def parse_gpus(spec: str, host_memory_gb: float | None = None, inter_node_gbps: float | None = None,
               calibration_store: Path | None = None, definition: dict | None = None,
               page_migration_gb_s: float | None = None, cpu_optimizer_gparams_s: float | None = None) -> HardwareSpec:
    """Parse ``--gpus`` (and ``--host-memory-gb``, decimal GB per node; ``--inter-node-gbps``,
    Gbit/s per node) into a HardwareSpec; ``calibration_store`` (``--calibration``) supplies the
    GPU's measured corrections. ``definition``: the content of the user GPU file ``spec`` names, as
    a plan file holds it (GpuSpec.definition): used instead of reading the file.
    ``page_migration_gb_s`` (GB/s) and ``cpu_optimizer_gparams_s`` (billion parameters a second
    per node): the rates planner otherwise assumes (planner/cost/overheads.py)."""
    match = _SPEC.match(spec or "")
    if not match:
        raise PlannerInputError(f"malformed --gpus {spec!r}", hint=f"Grammar: {GRAMMAR}")
    first, second, name = match.groups()
    nodes, per_node = (int(first), int(second)) if second else (1, int(first or 1))
    gpu = _defined_gpu(definition, name, calibration_store) if definition else resolve_gpu(name, calibration_store)
    problems = []
    if nodes < 1 or per_node < 1:
        problems.append(f"--gpus {spec!r}: counts must be at least 1")
    notes = [] if _is_file(name) else gpu_notes(name)
    if per_node > gpu.max_gpus_per_node:
        usual, nodes_needed = gpu.max_gpus_per_node, -(-per_node // gpu.max_gpus_per_node)
        split = f"for {nodes_needed} nodes of {usual} write {nodes_needed}x{usual}x{name}"
        if per_node > max(MAX_GPUS_PER_NODE, usual):
            problems.append(f"--gpus {spec!r}: {per_node} GPUs in one node is more than any {gpu.id} server holds; {split}")
        notes.append(f"{per_node} {gpu.id} in one node is above the usual {usual} (catalog max_gpus_per_node); "
                     f"assuming its {gpu.gpu_link_kind} link between all of them; {split}")
    if host_memory_gb is not None and not (0 < host_memory_gb < 1e7):
        problems.append(f"--host-memory-gb {host_memory_gb}: give the host RAM per node in GB (e.g. 512)")
    if inter_node_gbps is not None and not (0 < inter_node_gbps < 1e6):
        problems.append(f"--inter-node-gbps {inter_node_gbps}: give the network bandwidth per node in Gbit/s (e.g. 3200)")
    if page_migration_gb_s is not None and not (0 < page_migration_gb_s < 1e5):
        problems.append(f"--page-migration-gb-s {page_migration_gb_s}: give paged state's migration rate in GB/s (e.g. 20)")
    if cpu_optimizer_gparams_s is not None and not (0 < cpu_optimizer_gparams_s < 1e5):
        problems.append(f"--cpu-optimizer-gparams-s {cpu_optimizer_gparams_s}: give billions of parameters a CPU "
                        "optimizer updates per second per node (e.g. 1)")
    if problems:
        raise PlannerInputError(problems, hint=f"Grammar: {GRAMMAR}")
    host = int(host_memory_gb * GB) if host_memory_gb is not None else default_host_memory_bytes(gpu, per_node)
    gbps = inter_node_gbps if inter_node_gbps is not None else DEFAULT_INTER_NODE_GBPS_PER_GPU * per_node
    return HardwareSpec(
        gpu=gpu, nodes=nodes, gpus_per_node=per_node, host_memory_bytes_per_node=host,
        inter_node_bytes_per_s=gbps * 1e9 / 8, notes=notes,
        page_migration_bytes_per_s=page_migration_gb_s * 1e9 if page_migration_gb_s is not None else None,
        cpu_optimizer_params_per_s=cpu_optimizer_gparams_s * 1e9 if cpu_optimizer_gparams_s is not None else None,
    )
