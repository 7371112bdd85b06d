"""What an answer assumed, in one list of short phrases: each says where its value came from
(a flag, or planner's default and why), so no default decides a plan unseen."""

from planner.catalog.calibration import CALIBRATED
from planner.core.lengths import BATCHING_WORDS, Batching, Lengths
from planner.core.specs import HardwareSpec
from planner.core.timing import ASSUMED_RATE_TERMS
from planner.core.units import GB
from planner.core.vocabulary import ROWS_PER_SAMPLE
from planner.cost import rollout
from planner.cost.overheads import HOST_RESERVE_FRACTION, PAGE_MIGRATION_LINK_FRACTION
from planner.engine.lengths_file import lengths_of
from planner.strategies.method import GRPO_DEFAULTS
from planner.strategies.rates import ASSUMED, FLAG, MEASURED, cpu_optimizer_rate, page_migration_rate, rate_origin


def assumptions(target, hardware: HardwareSpec, seq_len: int, global_batch: int, *,
                seq_given: bool, batch_given: bool, batch_words: str | None = None) -> list[str]:
    """``target``: the PlanTarget (its host RAM, network and margin flags; and the data's shape,
    ``DataShape``, where it has one); ``seq_len``: the cap on a sequence's tokens. ``batch_words``:
    the batch as estimate states it (micro-batch x accumulation), instead of a global batch."""
    batching = getattr(target, "batching_used", Batching.PACKED)
    lengths = lengths_of(target)
    seen = lengths.capped(seq_len) if lengths is not None and batching != Batching.PACKED else None
    cap = "" if batching == Batching.PACKED else "up to "
    given = getattr(target, "seq_len", None) if seq_given else None
    source = ("--seq-len" if given == seq_len else f"the longest sample; --seq-len {given:,}" if given
              else "the longest sample" if seen else "default")
    out = [f"seq {cap}{seq_len:,} tokens ({source})"]
    rows = rows_per_sample(target)
    tokens = f"{global_batch * rows * seq_len:,}" if seen is None else f"~{round(global_batch * rows * seen.mean):,} real"
    samples = f"{global_batch:,} seq" if rows == 1 else f"{global_batch:,} pairs = {global_batch * rows:,} seq"
    if grpo_named(target):
        groups = getattr(target, "num_generations", None) or GRPO_DEFAULTS["num_generations"]
        samples = f"{global_batch:,} completions" + (f" = {global_batch // groups:,} prompts x {groups}"
                                                      if global_batch % groups == 0 else "")
    batch = batch_words or f"global batch {samples} = {tokens} tokens"
    default = "default" if batch_words else "default: >= 131,072 tokens"
    out.append(f"{batch} ({'flags' if batch_given else default})")
    out.append(data_words(batching, lengths, seen, seq_len))
    if grpo_named(target):
        completion = getattr(target, "completion_len", None) or GRPO_DEFAULTS["max_completion_length"]
        out.append(f"each row a prompt of up to {max(0, seq_len - completion):,} tokens and a completion of "
                   f"{completion:,} (--completion-len): every completion generated to its full length, "
                   f"{generation_words(target, global_batch)}, decoding bound by memory bandwidth (vLLM's at "
                   f"{rollout.DECODE_BANDWIDTH_EFFICIENCY:.0%} of the datasheet's); vLLM's CUDA graphs "
                   f"{rollout.CUDA_GRAPH_BYTES / 2**30:g} GiB beyond its share (assumed)")
    host = hardware.host_memory_bytes_per_node / GB
    out.append(f"host RAM {host:,.0f} GB/node, {HOST_RESERVE_FRACTION:.0%} kept free "
               + ("(--host-memory-gb)" if target.host_memory_gb is not None else "(assumed: 2x GPU memory; --host-memory-gb)"))
    if hardware.nodes > 1:
        gbps = hardware.inter_node_bytes_per_s * 8 / 1e9
        out.append(f"network {gbps:,.0f} Gbit/s/node " + ("(--inter-node-gbps)" if target.inter_node_gbps is not None
                                                            else "(assumed; --inter-node-gbps)"))
    out.append(f"margin {target.margin:.0%} of GPU memory kept free")
    return out


def generation_words(target, global_batch: int) -> str:
    """How often a GRPO plan generates: once per optimizer step (TRL's default), or its generation
    batch and num_iterations (tokens/s counting every pass over a generation)."""
    size = getattr(target, "generation_batch_size", None) or 0
    mu = getattr(target, "num_iterations", None) or 1
    if size in (0, global_batch) and mu == 1:
        return "one generation per optimizer step"
    words = f"generation batch {size or global_batch:,} completions (--generation-batch-size)"
    if mu > 1:
        words += f", each used for {mu} passes (--num-iterations; tokens/s counts every pass)"
    return words


def grpo_named(target) -> bool:
    """Whether ``target`` names GRPO (its one method)."""
    method = getattr(target, "method", None)
    named = {str(m) for m in (method if isinstance(method, list) else [method]) if m is not None}
    return named == {"grpo"}


def rows_per_sample(target) -> int:
    """Sequences per sample of the method(s) ``target`` names (``ROWS_PER_SAMPLE``: a DPO pair is
    two); 1 where it names none, or methods of different shapes."""
    method = getattr(target, "method", None)
    named = {ROWS_PER_SAMPLE.get(str(m), 1) for m in (method if isinstance(method, list) else [method]) if m is not None}
    return named.pop() if len(named) == 1 else 1


#: Per assumed-rate time term, in ``ASSUMED_RATE_TERMS``' order: its words, its flag.
RATE_WORDS = dict(zip(ASSUMED_RATE_TERMS, (("paged state's migration", "--page-migration-gb-s"),
                                           ("the CPU optimizer step", "--cpu-optimizer-gparams-s")), strict=True))


def data_words(batching: Batching, lengths: Lengths | None, seen: Lengths | None, cap: int) -> str:
    """How the plan batches the data, and the samples' lengths it planned with (``seen``: the
    ``lengths`` truncated at ``cap``, where they shape the rows)."""
    words = BATCHING_WORDS[batching]
    if batching == Batching.PACKED:
        return words + (" (--lengths do not change a packed plan)" if lengths is not None else "")
    if lengths is None or seen is None:
        return (f"{words}; every sample at the full length (no --lengths: the peak holds; shorter samples "
                "train fewer real tokens/s)")
    cut = sum(n for t, n in lengths.counts if t > cap)
    return (f"{words}; {lengths.samples:,} samples (--lengths {lengths.source}): mean {seen.mean:,.0f}, longest "
            f"{seen.longest:,} tokens" + (f", {cut / lengths.samples:.1%} truncated at {cap:,}" if cut else ""))


def rate_assumptions(hardware: HardwareSpec, terms: dict[str, float], engine: str) -> list[str]:
    """The host rates a plan's step time uses (``terms``: its time terms, seconds), each with
    where it came from: the flag, a measurement beside the GPU, or planner's assumption."""
    out = []
    if terms.get("paged_migration"):
        origin = rate_origin(hardware, "paged_migration", engine)[0]
        out.append(f"page migration {page_migration_rate(hardware) / GB:,.1f} GB/s " + {
            FLAG: "(--page-migration-gb-s)",
            MEASURED: f"(measured beside this GPU{_where(hardware, 'paged_migration', engine)}; --page-migration-gb-s)",
            ASSUMED: f"(assumed: {PAGE_MIGRATION_LINK_FRACTION:.0%} of the host link; --page-migration-gb-s)"}[origin])
    if terms.get("cpu_optimizer_step"):
        origin = rate_origin(hardware, "cpu_optimizer_step", engine)[0]
        out.append(f"CPU optimizer {cpu_optimizer_rate(hardware, engine) / 1e9:,.2g}B params/s/node " + {
            FLAG: "(--cpu-optimizer-gparams-s)",
            MEASURED: f"(measured in {engine} beside this GPU{_where(hardware, 'cpu_optimizer_step', engine)}; "
                      "--cpu-optimizer-gparams-s)",
            ASSUMED: "(assumed; --cpu-optimizer-gparams-s)"}[origin])
    return out


def _where(hardware: HardwareSpec, term: str, engine: str) -> str:
    """Which measurement: a calibration store's, or the catalog's (its GPU file names the run)."""
    return ", calibrated" if rate_origin(hardware, term, engine)[1].startswith(CALIBRATED) else ", docs/measured.md"


def rate_warning(terms: dict[str, float], step_seconds: float, band: float, assumed: tuple[str, ...]) -> str | None:
    """When more than ``band`` of a plan's step runs at rates planner assumes (``assumed``: the
    terms whose rate no flag set and nothing measured): which, and how to set them."""
    spent = {t: terms[t] for t in assumed if terms.get(t)}
    share = sum(spent.values()) / step_seconds if step_seconds else 0.0
    if share <= band:
        return None
    words = " and ".join(RATE_WORDS[t][0] for t in spent)
    flags = ", ".join(RATE_WORDS[t][1] for t in spent)
    return (f"speed rests on an assumed rate: {words} is {share:.0%} of the step at a rate planner assumes, "
            f"not one measured on this hardware ({flags} sets it)")
