"""The GPU validation's driver: planner's predictions against one short window on a real GPU.

    bash benchmarks/gpu_validate.sh          # on the GPU machine (installs the carried wheels)
    bash benchmarks/gpu_validate.sh --cpu    # the same driver on the CPU: tiny model, ~1-2 minutes

Phases, each with a hard end (fractions of the whole budget, --budget); a case starts only if
its expected seconds (scaled by how long the cases so far took against theirs) fit before its
phase ends, else it is written as skipped; a running case is killed at the run's last deadline.
Within each tier, the cases an earlier window measured on this GPU (benchmarks/results/<gpu>/*/)
run last, so that successive windows cover the whole list:
- A. setup: facts, a smoke test per library (setup.py), the device's ceilings;
- B. probes, tier 1 (validation/cases.py);
- C. launches (launches.py): the suggested plan, its QLoRA twin, a DPO, a KTO and a GRPO plan,
  run by their launch.sh (the ones no earlier window ran first);
- D. probes, tiers 2 and 3, then torch's ring attention on the GPU's kernels (``ring_attention``);
- E. the calibration fitted from the runs, the figure, the summary table (printed last).

Every result is written to --out as it comes (at most 8 files): env.json, probes.csv,
probes.jsonl, calibration-<gpu>.sqlite, calibrate.json, launch.json, validation.png, and log.txt
(the shell's copy of this output).

Probes run in children forked from this process (probes/forked.py), which imports torch and planner
once and never starts CUDA itself.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: Where each phase must end, as a fraction of the run's budget (start to --deadline).
PHASE_ENDS = {"A": 0.15, "B": 0.53, "C": 0.745, "D": 0.94, "E": 1.0}
#: Seconds kept free at the end for phase E when a running case is cut short.
E_RESERVE = 0.05
#: Seconds the host-rates measurement may run past phase A's end (DeepSpeed's CPU-Adam compiles
#: on first use: ~40 s on 2 cores); the cases after it are scheduled by the time left.
HOST_RATES_GRACE = 60.0
#: Case timeouts: this many times the expected seconds (at least MIN_TIMEOUT).
TIMEOUT_FACTOR, MIN_TIMEOUT = 4.0, 60.0
CPU_EXPECTED_SECONDS = 4.0
#: One launch's seconds on an H100 (imports, load, 3 steps), the slowest of the H100 runs in
#: benchmarks/results/H100-SXM-80 (suggested 64.1, 58.0, 65.4 s; suggested-qlora 45.3, 42.7 s);
#: DPO's, KTO's and GRPO's are assumed (the suggested plan's; KTO's three no-grad forwards and
#: GRPO's three generations of 64 completions of 128 tokens on top) until a window measures them. A launch is skipped when its
#: phase has less left, so time running out reads as skipped; the launches an earlier window ran
#: on this GPU go last (``measured_launches``), so that successive windows cover them all.
LAUNCH_EXPECTED = {"suggested": 66.0, "suggested-qlora": 46.0, "suggested-dpo": 70.0, "suggested-kto": 80.0,
                   "suggested-grpo": 90.0}
#: The model folder (12 s) and the two launches a window has time for.
LAUNCH_SECONDS = 12.0 + 2 * max(LAUNCH_EXPECTED.values())


class Clock:
    """The run's budget in monotonic seconds: phase ends, and the observed pace of the cases."""

    def __init__(self, start: float, deadline: float) -> None:
        self.start, self.deadline = start, deadline
        self.ratios: list[float] = []
        self.phases: dict[str, dict] = {}

    def end(self, phase: str) -> float:
        return self.start + PHASE_ENDS[phase] * (self.deadline - self.start)

    def left(self, phase: str) -> float:
        return self.end(phase) - time.monotonic()

    def expect(self, seconds: float) -> float:
        """Expected seconds, scaled by the median ratio of actual to expected so far (0.5x-3x)."""
        if not self.ratios:
            return seconds
        return seconds * min(3.0, max(0.5, statistics.median(self.ratios)))

    def hard_stop(self) -> float:
        return self.deadline - E_RESERVE * (self.deadline - self.start)

    def phase(self, name: str):
        clock = self

        class _Phase:
            def __enter__(self):
                self.t0 = time.monotonic()
                print(f"\n== phase {name} (ends in {clock.left(name):.0f} s)", flush=True)

            def __exit__(self, *exc):
                clock.phases[name] = {"seconds": round(time.monotonic() - self.t0, 1),
                                      "ended_before_deadline": time.monotonic() <= clock.end(name)}
        return _Phase()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="the tiny model on the CPU (CI)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--started", type=float, default=None, help="epoch seconds the run began (the shell's)")
    ap.add_argument("--budget", type=float, default=None, help="seconds from --started to the last deadline")
    ap.add_argument("--only", default="", help="comma-separated: the cases whose key contains one of them; "
                                                "'launch' (every launch) or 'launch=NAME' (one); nothing: all")
    ap.add_argument("--skip-launches", action="store_true", help="no phase C (the launches)")
    ap.add_argument("--dry-run", metavar="GPU", help="list the cases, their predictions on this catalog GPU and "
                                                     "their expected seconds; run nothing")
    args = ap.parse_args()
    if args.dry_run:
        return dry_run(args.dry_run)
    device = "cpu" if args.cpu else "cuda"
    budget = args.budget or (240.0 if args.cpu else 470.0)
    started = args.started or time.time()
    start = time.monotonic() - (time.time() - started)
    clock = Clock(start, start + budget)
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
                       "TOKENIZERS_PARALLELISM": "false"})
    imported = _import_once(device)
    env: dict = {"mode": device, "budget_seconds": budget, "import_seconds": imported}

    from validation import launches, setup
    from validation.cases import CASES

    with clock.phase("A"):
        env["facts"] = setup.facts()
        info = _device(device)
        env["device"] = info.model_dump()
        if device == "cuda" and not info.available:
            print(f"no GPU: {info.message}", flush=True)
            _write(args.out / "env.json", env)
            return 2
        env["smoke"] = setup.smoke_tests(device, clock.end("A"))
        env["ceilings"] = setup.ceilings(device)
        print(f"  ceilings: {env['ceilings']}", flush=True)
        env["host_rates"] = setup.host_rates(device, clock.end("A") + HOST_RATES_GRACE)
    _write(args.out / "env.json", env)

    from validation.report import Records, figure, summary

    from planner.probes.device import catalog_gpu

    device_gpu = catalog_gpu(info.name, info.total_bytes) if device == "cuda" else "cpu"
    store = args.out / f"calibration-{device_gpu}.sqlite"
    records = Records(args.out)
    setup.store_host_rates(store, device_gpu, info, env)
    before = measured_before(device_gpu)
    # within each tier, what no earlier window measured on this GPU goes first
    only = Only(args.only)
    cases = sorted((c for c in CASES if only.case(c.key)), key=lambda c: c.key in before)
    if before:
        print(f"  {len(before)} cases measured before on {device_gpu} (benchmarks/results): they run last", flush=True)
    runner = CaseRunner(device, device_gpu, info, env["smoke"], store, clock, records)
    with clock.phase("B"):
        for case in cases:
            if case.tier == 1:
                runner.run(case, "B")
    launch_results: list[dict] = []
    with clock.phase("C"):
        if not args.skip_launches and only.launches():
            launch_results = run_launches(launches, device, device_gpu, clock, args.out, only)
    with clock.phase("D"):
        for case in cases:
            if case.tier > 1:
                runner.run(case, "D")
        if device == "cuda" and only.case(RING_KEY):
            env["ring_attention"] = ring_attention(clock)
    with clock.phase("E"):
        env["calibrate"] = calibrate(store, args.out / "calibrate.json")
        env["figure"] = figure(records.rows, args.out / "validation.png") or "validation.png"
    env["phases"] = clock.phases
    env["parent_imported"] = sorted(m for m in ("transformers", "torchao", "bitsandbytes", "deepspeed", "peft",
                                                "accelerate", "liger_kernel") if m in sys.modules)
    env["total_seconds"] = round(time.monotonic() - start, 1)
    _write(args.out / "env.json", env)
    print("\n" + "\n".join(summary(records.rows, launch_results)), flush=True)
    print(f"total {env['total_seconds']} s of {budget:.0f}; phases "
          + ", ".join(f"{k} {v['seconds']} s" for k, v in clock.phases.items()), flush=True)
    failed = [r["key"] for r in records.rows if r["status"] in ("error", "timeout")]
    return 1 if failed or any(_launch_failed(x) for x in launch_results) else 0


#: The ring-attention measurement's name for --only, and the seconds it needs (4 children of ~8 s).
RING_KEY, RING_SECONDS = "ring-attention", 40.0


def ring_attention(clock: Clock) -> dict:
    """torch's ring attention functions on this GPU's real kernels under a fake process group of
    2, 4 and 8 ranks (benchmarks/ring_attention_transients.py): each rank's forward and backward
    peaks beside planner's ``ring_transient_elements`` (no second GPU is needed: the fake group's
    collectives move nothing, their buffers are allocated). Skipped when phase D has not the time."""
    if clock.left("D") < clock.expect(RING_SECONDS):
        print(f"  {RING_KEY}: skipped, {clock.left('D'):.0f} s left", flush=True)
        return {"status": "skipped", "seconds_left": round(clock.left("D"))}
    import ring_attention_transients as ring

    started = time.monotonic()
    try:
        found = ring.rows("cuda", ring.GPU_CASES, deadline=clock.end("D"))
    except Exception as e:  # (a failed child: its message, and the run goes on)
        print(f"  {RING_KEY}: error {type(e).__name__}: {str(e)[-400:]}", flush=True)
        return {"status": "error", "error": f"{type(e).__name__}: {str(e)[-2000:]}"}
    print(f"  {RING_KEY} on the GPU, unit: one local q ({ring.TOKENS:,} tokens, head_dim {ring.HEAD_DIM}):", flush=True)
    print("\n".join("    " + line for line in ring.table(found)), flush=True)
    return {"status": "ok", "rows": found, "seconds": round(time.monotonic() - started, 1)}


def _launch_failed(result: dict) -> bool:
    """A launch that ran and did not exit 0, or that could not start (not one skipped for time)."""
    if result.get("rc") is not None:
        return result["rc"] != 0
    return not str(result.get("error", "")).startswith("skipped")


def dry_run(gpu: str) -> int:
    """The case list as the GPU run would meet it: each plan's verdict and peak, expected seconds."""
    from validation.cases import CASES

    from planner.engine.estimate import estimate
    from planner.schema.estimate import EstimateRequest

    total = 0.0
    print(f"{'tier':4s} {'case':34s} {'gpus':16s} {'fits':5s} {'peak GiB':>8s} {'step s':>7s} {'exp. s':>6s}")
    for case in CASES:
        plan = estimate(EstimateRequest(model=case.model, gpus=case.gpus_on(gpu), **case.config))
        total += case.expected_seconds
        print(f"{case.tier:<4d} {case.key:34s} {plan.hardware.spec:16s} {str(plan.fits):5s} "
              f"{plan.memory['peak'] / 2**30:8.2f} {plan.time.step_seconds:7.3f} {case.expected_seconds:6.0f}")
    print(f"probes: {len(CASES)} cases, {total:.0f} s expected; launches ~{LAUNCH_SECONDS:.0f} s; "
          f"{RING_KEY} ~{RING_SECONDS:.0f} s (GPU only); budget {470} s with phase ends {PHASE_ENDS}")
    return 0


def measured_before(device_gpu: str) -> set[str]:
    """Keys of the cases an earlier window measured on this GPU (status ok in a committed
    benchmarks/results/<gpu>/<date>/probes.csv)."""
    import csv

    keys: set[str] = set()
    for path in (Path(__file__).resolve().parent / "results" / device_gpu).rglob("probes.csv"):
        with path.open() as f:
            keys |= {r["key"] for r in csv.DictReader(f) if r.get("status") == "ok"}
    return keys


def measured_launches(device_gpu: str) -> set[str]:
    """Names of the launches an earlier window ran to the end on this GPU (rc 0 in a committed
    benchmarks/results/<gpu>/<date>/launch.json)."""
    names: set[str] = set()
    for path in (Path(__file__).resolve().parent / "results" / device_gpu).rglob("launch.json"):
        try:
            names |= {x["name"] for x in json.loads(path.read_text()) if x.get("rc") == 0}
        except (ValueError, KeyError, TypeError):
            continue
    return names


def _import_once(device: str) -> float:
    """torch and planner, imported before any child is forked; on a GPU the children import the
    libraries a case needs (on the H100 an import under transformers' model code started CUDA,
    which a forking parent must never do), on the CPU this process imports them once too."""
    t0 = time.perf_counter()
    import torch

    import planner.probes.measured  # noqa: F401
    import planner.probes.measured_command  # noqa: F401
    from planner.engine.estimate import estimate  # noqa: F401

    if device == "cpu":
        import transformers.models.llama.modeling_llama  # noqa: F401

        import planner.probes.measured_setup  # noqa: F401

    if torch.cuda.is_initialized():
        raise RuntimeError("an import started CUDA in the parent: forked probes could not use the GPU")
    return round(time.perf_counter() - t0, 1)


def _device(device: str):
    from planner.probes.device import DeviceInfo, probe_device
    from planner.probes.forked import run_forked

    if device == "cpu":
        return DeviceInfo(available=True, name="cpu")
    outcome = run_forked(lambda _: probe_device().model_dump(), "", 120)
    if outcome.status != "ok":
        return DeviceInfo(available=False, message=outcome.describe())
    return DeviceInfo.model_validate(outcome.value)


class CaseRunner:
    """One case: its plan, whether it may run (its smoke tests, the time left), the measured
    probe in a forked child, and its records."""

    def __init__(self, device, device_gpu, info, smoke, store, clock, records) -> None:
        self.device, self.device_gpu, self.info, self.smoke = device, device_gpu, info, smoke
        self.store, self.clock, self.records = store, clock, records

    def run(self, case, phase: str) -> None:
        from validation.cases import CPU_SHAPE
        from validation.launches import TINY_CONFIG
        from validation.report import csv_row, untimed

        from planner.catalog.models import model_config
        from planner.core.errors import PlannerInputError
        from planner.engine.estimate import estimate
        from planner.probes.measured import measure_forked
        from planner.probes.measured_command import measure_plan
        from planner.schema.estimate import EstimateRequest

        cpu = self.device == "cpu"
        expected = CPU_EXPECTED_SECONDS if cpu else case.expected_seconds
        model = str(TINY_CONFIG.parent) if cpu else case.model
        gpus = case.gpus_on("H100-SXM-80" if cpu else self.device_gpu)
        plan, t0 = None, time.monotonic()

        def record(status: str, message: str, comparison=None) -> None:
            row = csv_row(case, model, plan, comparison, status, message, time.monotonic() - t0, expected)
            self.records.add(row, {"case": case.__dict__, "gpus": gpus, "status": status, "message": message,
                                   "plan": plan.model_dump(mode="json") if plan else None,
                                   "comparison": comparison.model_dump(mode="json") if comparison else None})
            print(f"  {case.key:34s} {row['status']:8s} mem {row.get('memory_error') or '-':>8s} "
                  f"time {row.get('time_error') or '-':>8s} {row['seconds']:>6s} s  "
                  f"{row.get('verdict') or message[:60]}", flush=True)

        try:
            plan = estimate(EstimateRequest(model=model, gpus=gpus, **(case.config | (CPU_SHAPE if cpu else {}))))
        except PlannerInputError as e:
            return record("refused", "; ".join(e.problems))
        if not plan.feasible and not case.measure_refused:
            return record("refused", "planner refuses the plan: " + "; ".join(plan.reasons)[:300])
        if cpu and not case.cpu:
            return record("skipped", "needs CUDA")
        failed = [n for n in case.needs if not self.smoke.get(n, {}).get("ok")]
        if failed:
            return record("skipped", "smoke test failed: " + ", ".join(
                f"{n} ({self.smoke.get(n, {}).get('detail', 'not run')[:80]})" for n in failed))
        want = self.clock.expect(expected)
        if want > self.clock.left(phase):
            return record("skipped", f"needs ~{want:.0f} s, phase {phase} has {max(0, self.clock.left(phase)):.0f} s")
        timeout = min(max(TIMEOUT_FACTOR * want, MIN_TIMEOUT), self.clock.hard_stop() - time.monotonic())
        depths = list(case.cpu_depths if cpu else case.extrapolate_from) or None
        timed = not untimed(case, plan)
        try:
            comparison = measure_plan(plan, model, model_config(model), self.info, extrapolate_from=depths,
                                      timeout=timeout / (len(depths) if depths else 1), runner=measure_forked,
                                      device_kind=self.device, store=self.store, timed=timed,
                                      allocator_conf=case.allocator_conf)
        except RuntimeError as e:  # the runner refused (this process started CUDA): the case's result
            return record("error", str(e))
        self.clock.ratios.append((time.monotonic() - t0) / expected)
        record(comparison.status, comparison.message, comparison)


class Only:
    """``--only``: comma-separated tokens; a case runs when its key contains one that is not a
    launch token; ``launch`` runs every launch, ``launch=NAME`` the one named. Empty: everything."""

    def __init__(self, text: str) -> None:
        tokens = [t.strip() for t in text.split(",") if t.strip()]
        self.everything = not tokens
        self.keys = [t for t in tokens if not t.startswith("launch")]
        self.launch_names = {t.partition("=")[2] for t in tokens if t.startswith("launch")}

    def case(self, key: str) -> bool:
        return self.everything or any(k in key for k in self.keys)

    def launches(self) -> bool:
        return self.everything or bool(self.launch_names)

    def launch(self, name: str) -> bool:
        return self.everything or "" in self.launch_names or name in self.launch_names


def run_launches(launches, device: str, device_gpu: str, clock: Clock, out: Path, only: Only | None = None) -> list[dict]:
    """Phase C in a fresh work folder (plans are never written over), removed at the end: what
    the launches showed is in launch.json."""
    results: list[dict] = []
    if clock.left("C") < 30:
        results.append({"name": "launches", "rc": None, "error": f"skipped: {clock.left('C'):.0f} s left"})
        _write(out / "launch.json", results)
        return results
    root = Path(os.environ.get("PLANNER_VALIDATE_WORK", tempfile.gettempdir()))
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="planner-validate-", dir=root))
    try:
        _launch_both(launches, device, device_gpu, clock, work, results, out / "launch.json", only or Only(""))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return results


def _launch_both(launches, device: str, device_gpu: str, clock: Clock, work: Path, results: list, path: Path,
                 only: Only) -> None:
    try:
        folder, ref, seconds = launches.build_folder(work, device)
        print(f"  model folder {folder} in {seconds:.1f} s", flush=True)
    except RuntimeError as e:
        results.append({"name": "model folder", "rc": None, "error": str(e)})
        _write(path, results)
        return
    gpus = f"1x{'H100-SXM-80' if device == 'cpu' else device_gpu}"
    before = measured_launches(device_gpu)
    named = not only.everything and "" not in only.launch_names
    for name in sorted(launches.LAUNCHES, key=lambda n: n in before):
        if not only.launch(name):
            results.append({"name": name, "rc": None, "error": "skipped: not in --only"})
            continue
        if device == "cpu" and name != "suggested" and not named:  # (the others on the CPU: tests/test_launch_live.py)
            results.append({"name": name, "rc": None, "error": "skipped: --cpu runs one launch"})
            continue
        left = min(clock.left("C"), clock.hard_stop() - time.monotonic())
        want = 20.0 if device == "cpu" else LAUNCH_EXPECTED[name]
        if left < want:
            results.append({"name": name, "rc": None, "error": f"skipped: needs ~{want:.0f} s, phase C has {left:.0f} s"})
            print(f"  launch {name}: skipped, needs ~{want:.0f} s, phase C has {left:.0f} s", flush=True)
            continue
        job = work / name
        plan = launches.write_plan(ref, gpus, job, device, name)
        result = {"name": name, "plan": plan}
        if plan["rc"] != 0:
            result |= {"rc": None, "error": f"planner suggest exited {plan['rc']}: {plan['stderr'][-300:]}"}
        else:
            result |= launches.run_launch(job, folder, device, timeout=max(10.0, left - 5))
        print(f"  launch {name}: rc {result.get('rc')} in {result.get('wall_seconds')} s; "
              f"{result.get('live_verdict') or result.get('error', '')}", flush=True)
        results.append(result)
        _write(path, results)
    _write(path, results)


def calibrate(store: Path, path: Path) -> dict:
    """``planner calibrate`` on the run's store: the corrections and the errors before and after."""
    from planner.core.errors import PlannerInputError
    from planner.engine.calibrate import calibrate as fit
    from planner.schema.calibrate import CalibrateRequest

    try:
        result = fit(CalibrateRequest(store=store))
    except PlannerInputError as e:
        outcome = {"error": "; ".join(e.problems)}
    else:
        outcome = result.model_dump(mode="json")
    _write(path, outcome)
    return {"fitted": "error" not in outcome, "file": path.name}


def _write(path: Path, value) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(value, indent=1, default=str) + "\n")
    tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main())
