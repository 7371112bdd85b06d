"""``planner models`` and ``planner gpus``: the catalogs as rows (their --json) and as tables."""

from pydantic import ConfigDict
from rich.console import Console, Group
from rich.padding import Padding
from rich.text import Text

from planner.core.formatting import count
from planner.core.record import Record
from planner.render.layout import fits, table


class ModelEntry(Record):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str  # usable with --model
    family: str
    parameters: int


class GpuEntry(Record):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str  # usable with --gpus, as are the aliases
    memory_gib: float
    bf16_dense_tflops: float | None
    fp8_dense_tflops: float | None
    link: str  # the GPUs' link within a node
    aliases: list[str]


def model_entries() -> list[ModelEntry]:
    from planner.catalog.models import catalog, resolve_model
    from planner.cost.params import total_parameters

    out = []
    for mid in sorted(catalog(), key=str.lower):
        spec = resolve_model(mid)
        out.append(ModelEntry(id=mid, family=spec.family, parameters=total_parameters(spec)))
    return out


def gpu_entries() -> list[GpuEntry]:
    from planner.catalog.gpus import catalog

    return [GpuEntry(id=gid, memory_gib=f.memory_mib / 1024, bf16_dense_tflops=f.dense_tflops.get("bf16"),
                     fp8_dense_tflops=f.dense_tflops.get("fp8"), link=f.gpu_link.kind, aliases=list(f.aliases))
            for gid, f in sorted(catalog().items())]


def render_models(entries: list[ModelEntry], console: Console) -> None:
    t = table(("model", "left"), ("family", "left"), ("parameters", "right"))
    for e in entries:
        t.add_row(e.id, e.family, count(e.parameters))
    console.print(t)


def render_gpus(entries: list[GpuEntry], console: Console) -> None:
    """Aliases in their own column where it fits unwrapped, else under each GPU's id."""
    figures = (("GiB", "right"), ("bf16\nTFLOP/s", "right"), ("fp8\nTFLOP/s", "right"), ("link", "left"))
    wide = table(("gpu", "left"), *figures, ("aliases", "left"), wrap=("aliases",))
    narrow = table(("gpu (aliases)", "left"), *figures, wrap=("gpu (aliases)",))
    for e in entries:
        cells = (f"{e.memory_gib:,.1f}", _tflops(e.bf16_dense_tflops), _tflops(e.fp8_dense_tflops), e.link)
        aliases = ", ".join(e.aliases)
        wide.add_row(e.id, *cells, aliases)
        narrow.add_row(Group(Text(e.id), Padding(Text(aliases, style="dim"), (0, 0, 0, 2))), *cells)
    console.print(wide if fits(console, wide) else narrow)


def _tflops(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"
