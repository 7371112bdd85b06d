"""The calibration store: measured probe results and the per-GPU corrections fitted from them.

One SQLite file (stdlib ``sqlite3``; no torch needed to read it):
- ``measurements``: one row per measured probe, keyed by architecture (a hash of the model's
  config.json and the measured depth), plan (the training configuration and world size), GPU
  (the device it ran on) and software (torch, CUDA and the libraries that change memory and
  speed). Probing the same key again replaces the row: the store keeps the latest measurement.
- ``host_rates``: per GPU, the host-side rates measured beside it (planner/probes/host_rates.py:
  the CPU optimizer step per engine, paged state's migration, the pinned link); the latest kept.
- ``corrections``: per GPU, what ``planner calibrate`` fitted (planner/engine/calibrate.py): the CUDA
  context, the caching allocator's reserve, and achieved FLOP/s per compute dtype as a factor on
  the catalog's efficiency. ``apply`` puts them into a GpuSpec; the analytic model then uses them
  and its output says so (GpuSpec.calibration).

Which store a command uses is explicit: its ``--calibration`` flag (a request's ``calibration``
field in Python). The flag's default is ``store_path()``: ``$PLANNER_CALIBRATION`` (a file path;
``off`` disables the store), else ``$XDG_CACHE_HOME/planner/calibration.sqlite`` (``~/.cache``
when unset). Nothing below the command line reads the environment.
"""

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pydantic import ConfigDict, Field, ValidationError

from planner.core.errors import PlannerInputError
from planner.core.record import Record
from planner.core.specs import Bytes, Calibration, GpuSpec, HostRateSpec, Rate, Scale

if TYPE_CHECKING:
    import sqlite3

ENV = "PLANNER_CALIBRATION"
R = TypeVar("R", bound=Record)
#: How a rate's source starts when a calibration store's corrections supplied it.
CALIBRATED = "calibration store"
OFF = ("off", "none", "0", "")
#: Software whose version changes memory or speed: part of every measurement's key.
SOFTWARE = ("torch", "cuda", "transformers", "accelerate", "deepspeed", "bitsandbytes", "torchao")
STATUSES = ("ok", "oom", "error", "timeout", "refused")


class Measurement(Record):
    """One measured probe of one plan on one device (probes/measured.py fills it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str  # the --model reference as given (catalog id, or a path)
    config_json: dict  # the architecture measured (re-evaluated by the fit)
    layers: int | None = None  # depth measured (None: the model's full depth)
    config: dict  # planner.core.vocabulary.TrainingConfig as JSON
    world_size: int = Field(1, ge=1)  # the plan's GPU count (FSDP / ZeRO ranks under a fake process group)
    target_gpus: str  # the plan's --gpus
    device_gpu: str  # catalog id of the GPU it ran on ("cpu" for a CPU run)
    device_name: str  # as the driver names it
    versions: dict[str, str | None]  # SOFTWARE -> version (None: not installed)
    status: str  # one of STATUSES
    message: str = ""
    max_allocated_bytes: int | None = None  # torch.cuda.max_memory_allocated
    max_reserved_bytes: int | None = None  # torch.cuda.max_memory_reserved
    driver_used_bytes: int | None = None  # what the driver sees the process use (context included)
    driver_method: str = ""  # how driver_used_bytes was read
    driver_reserved_bytes: int | None = None  # the GPU's memory (nvidia-smi total, the catalog's) less CUDA's total
    alloc_retries: int | None = None  # memory_stats num_alloc_retries (cudaMalloc retried after a cache flush)
    num_ooms: int | None = None
    step_seconds: list[float] = []  # each timed optimizer step
    median_step_seconds: float | None = None
    tokens_per_second: float | None = None  # this rank's tokens per second (median step)
    mfu: float | None = None  # model FLOPs / (median step x the device's dense peak in the compute dtype)
    communication: str = "none"  # none (one GPU), modelled (fake process group: collectives return at once)
    created: str = ""  # ISO timestamp

    @property
    def architecture(self) -> str:
        return architecture_key(self.config_json, self.layers)

    @property
    def plan_key(self) -> str:
        return _digest({"config": self.config, "world_size": self.world_size, "target_gpus": self.target_gpus})

    @property
    def software_key(self) -> str:
        return " ".join(f"{k}={self.versions.get(k)}" for k in SOFTWARE)


class HostRates(Record):
    """Host-side rates measured on the machine of one GPU (planner/probes/host_rates.py). None or
    absent: not measured there (the assumption in planner/cost/overheads.py stays)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: str  # catalog id of the GPU beside it
    device_name: str = ""
    cpus: int | None = None  # os.cpu_count() of the host
    cpu_optimizer_params_per_s: dict[str, Rate] = {}  # the bare optimizer (deepspeed, torch) -> parameters a
    # second, for reference: the rate a plan uses is fitted inside its engine (Corrections)
    page_migration_bytes_per_s: Rate | None = None  # paged state's round trip, bytes a second
    pinned_link_bytes_per_s: Rate | None = None  # pinned copy, the slower direction
    created: str = ""

    @classmethod
    def from_measured(cls, gpu: str, device_name: str, cpus: int | None, figures: dict, created: str) -> "HostRates":
        """From ``host_rates.measure``'s figures: each rate that was measured, none guessed."""
        def rate(name: str, key: str) -> float | None:
            value = figures.get(name, {}).get(key)
            return float(value) if isinstance(value, int | float) and value > 0 else None

        cpu = {engine: r for engine, name in (("deepspeed", "deepspeed_cpu_adam"), ("torch", "torch_cpu_adamw"))
               if (r := rate(name, "params_per_s")) is not None}
        links = [r for k in ("to_gpu_bytes_per_s", "to_host_bytes_per_s") if (r := rate("pinned_link", k)) is not None]
        return cls(gpu=gpu, device_name=device_name, cpus=cpus, cpu_optimizer_params_per_s=cpu,
                   page_migration_bytes_per_s=rate("paged_migration", "bytes_per_s"),
                   pinned_link_bytes_per_s=min(links) if len(links) == 2 else None, created=created)


class Corrections(Record):
    """What ``planner calibrate`` fitted for one GPU. None: not enough measurements for that term
    (the assumption in planner/cost/overheads.py or the catalog's efficiency stays)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: str
    software: str  # the software of the measurements it was fitted on
    measurements: int = Field(ge=1)
    context_bytes: Bytes | None = None  # driver-seen process memory beyond the allocator's reserved peak
    fragmentation_fraction: float | None = Field(None, ge=0, le=1)  # (reserved - allocated) / allocated at the peak
    flops_scale: dict[str, Scale] = {}  # compute dtype -> factor on the catalog's achieved FLOP/s
    cpu_optimizer_params_per_s: dict[str, Rate] = {}  # engine -> the CPU step's rate fitted inside it
    host_rates: HostRates | None = None  # measured beside this GPU (the latest in the store)
    fitted_at: str
    report: dict[str, float | int | dict[str, int] | None] = {}  # errors before / after, for people


def architecture_key(config_json: dict, layers: int | None) -> str:
    return _digest({"config": config_json, "layers": layers})


def _digest(value: object) -> str:
    import hashlib  # on first use: a plain suggest reads no store and hashes nothing

    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def store_path() -> Path | None:
    """The default store's file (the CLI's ``--calibration`` default), or None when
    ``$PLANNER_CALIBRATION`` is ``off``."""
    value = os.environ.get(ENV)
    if value is not None:
        return None if value.strip().lower() in OFF else Path(value).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "planner" / "calibration.sqlite"


class CalibrationStore:
    """The SQLite file. Every method opens and closes its own connection (probes and several
    workers may write at once: SQLite's file lock serialises them)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def _connect(self, write: bool) -> "sqlite3.Connection":
        """A connection; writing creates the file and its tables, reading never writes (the
        store may be read-only, or shared)."""
        import sqlite3  # on first use: a plain suggest finds no store file and opens none

        try:
            if write:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                con = sqlite3.connect(self.path, timeout=30)
                con.executescript(
                    "CREATE TABLE IF NOT EXISTS measurements (architecture TEXT, plan TEXT, gpu TEXT, software TEXT,"
                    " status TEXT, created TEXT, body TEXT, PRIMARY KEY (architecture, plan, gpu, software));"
                    "CREATE TABLE IF NOT EXISTS corrections (gpu TEXT PRIMARY KEY, body TEXT);"
                    "CREATE TABLE IF NOT EXISTS host_rates (gpu TEXT PRIMARY KEY, body TEXT);")
                return con
            return sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
        except (sqlite3.Error, OSError) as e:
            raise PlannerInputError(f"calibration store {self.path}: {e}",
                                    hint=f"Point {ENV} at a writable SQLite file, or set {ENV}=off.") from None

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:
        """Rows of a query; none when the store has no such table yet."""
        if not self.path.is_file():
            return []
        import sqlite3  # on first use, as in _connect

        con = self._connect(write=False)
        try:
            return con.execute(sql, args).fetchall()
        except sqlite3.DatabaseError as e:  # (OperationalError, and "file is not a database")
            if "no such table" in str(e):
                return []
            raise PlannerInputError(f"calibration store {self.path}: {e}", hint=f"Set {ENV}=off to ignore it.") from None
        finally:
            con.close()

    def _write(self, sql: str, args: tuple) -> None:
        import sqlite3  # on first use, as in _connect

        con = self._connect(write=True)
        try:
            with con:
                con.execute(sql, args)
        except sqlite3.DatabaseError as e:
            raise PlannerInputError(f"calibration store {self.path}: {e}",
                                    hint=f"Point {ENV} at a writable SQLite file, or set {ENV}=off.") from None
        finally:
            con.close()

    def _body(self, record: type[R], text: object, table: str) -> R:
        """A stored row's JSON as ``record``; a row planner cannot read (edited, or written by
        another tool) is an input error naming the store, never a validation traceback."""
        try:
            return record.model_validate_json(text if isinstance(text, str | bytes) else "")
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(map(str, first["loc"])) or "its JSON"
            raise PlannerInputError(f"calibration store {self.path}: a row of {table} is not planner's: {where}: "
                                    f"{first['msg']}", hint=f"Run planner calibrate again into a new store, or set "
                                                            f"{ENV}=off to ignore it.") from None

    def add(self, m: Measurement) -> None:
        self._write("INSERT OR REPLACE INTO measurements VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (m.architecture, m.plan_key, m.device_gpu, m.software_key, m.status, m.created, m.model_dump_json()))

    def measurements(self, gpu: str | None = None) -> list[Measurement]:
        rows = self._read("SELECT body FROM measurements" + (" WHERE gpu = ?" if gpu else "") + " ORDER BY created",
                          (gpu,) if gpu else ())
        return [self._body(Measurement, body, "measurements") for (body,) in rows]

    def save_host_rates(self, r: HostRates) -> None:
        self._write("INSERT OR REPLACE INTO host_rates VALUES (?, ?)", (r.gpu, r.model_dump_json()))

    def host_rates(self, gpu: str) -> HostRates | None:
        rows = self._read("SELECT body FROM host_rates WHERE gpu = ?", (gpu,))
        return self._body(HostRates, rows[0][0], "host_rates") if rows else None

    def save_corrections(self, c: Corrections) -> None:
        self._write("INSERT OR REPLACE INTO corrections VALUES (?, ?)", (c.gpu, c.model_dump_json()))

    def corrections(self, gpu: str) -> Corrections | None:
        rows = self._read("SELECT body FROM corrections WHERE gpu = ?", (gpu,))
        return self._body(Corrections, rows[0][0], "corrections") if rows else None

    def corrected_gpus(self) -> list[str]:
        """The GPU ids with fitted corrections."""
        return [gpu for (gpu,) in self._read("SELECT gpu FROM corrections ORDER BY gpu")]


def corrections_in(path: Path | None, gpu_id: str) -> Corrections | None:
    """This GPU's fitted corrections in the store at ``path`` (None: no store), if any. Reading
    never creates the file."""
    if path is None or not Path(path).is_file():
        return None
    return CalibrationStore(path).corrections(gpu_id)


def any_corrections(path: Path | None) -> bool:
    """Whether the store at ``path`` holds fitted corrections for any GPU (None, or no file:
    none). Reading never creates the file."""
    return path is not None and Path(path).is_file() and bool(CalibrationStore(path).corrected_gpus())


def apply(spec: GpuSpec, c: Corrections | None) -> GpuSpec:
    """The GPU with its fitted corrections: achieved FLOP/s scaled per compute dtype (attention
    follows the 16-bit factor; fractions stay at most 1), the context and allocator reserve, and
    the host rates measured beside it (each replacing the catalog's)."""
    if c is None:
        return spec
    eff = spec.efficiency
    gemm = {k: min(1.0, v * c.flops_scale.get(k, 1.0)) for k, v in eff.gemm.items()}
    sixteen = c.flops_scale.get("bf16", c.flops_scale.get("fp16", 1.0))
    note = (f"calibrated on {c.measurements} measured probes ({c.software}; fitted {c.fitted_at})")
    efficiency = eff.model_copy(update={"gemm": gemm, "attention": min(1.0, eff.attention * sixteen),
                                        "source": f"{note}; before: {eff.source}"})
    return spec.model_copy(update={"efficiency": efficiency, "host_rates": _host_rates(spec.host_rates, c),
                                   "calibration": Calibration(
        context_bytes=c.context_bytes, fragmentation_fraction=c.fragmentation_fraction,
        flops_scale=c.flops_scale, note=note)})


def _host_rates(catalog: HostRateSpec | None, c: Corrections) -> HostRateSpec | None:
    """The catalog's measured host rates with the calibration's in their place where it has them:
    the CPU step's rate fitted inside each engine, the paged state's round trip measured beside."""
    where = f"{CALIBRATED}, fitted {c.fitted_at}"
    cpu = dict(catalog.cpu_optimizer_params_per_s) if catalog else {}
    sources = dict(catalog.sources) if catalog else {}
    page = catalog.page_migration_bytes_per_s if catalog else None
    for engine, rate in c.cpu_optimizer_params_per_s.items():
        cpu[engine], sources[f"cpu_optimizer:{engine}"] = rate, where
    if c.host_rates is not None and c.host_rates.page_migration_bytes_per_s is not None:
        page, sources["page_migration"] = c.host_rates.page_migration_bytes_per_s, where
    if not cpu and page is None:
        return None
    return HostRateSpec(cpu_optimizer_params_per_s=cpu, page_migration_bytes_per_s=page, sources=sources)
