"""Host rates a plan's speed rests on: the user's flag, a measurement beside the GPU (the catalog's
or a calibration's), or planner's assumption; only an assumed one tags a plan, and calibrate fits
the CPU optimizer step's rate inside its engine from measured offload plans.

The measured figures are the project's own GPU runs (benchmarks/results/H100-SXM-80/2026-11-26-run7,
-run8): DeepSpeed ZeRO-1 with offload_optimizer on Llama-3.2-1B measured 0.921 and 0.706 s a step,
paged 32-bit AdamW state 21.3 and 23.4 GB/s for its round trip.
"""

import shutil
from pathlib import Path

import pytest

from planner.catalog.calibration import CalibrationStore
from planner.catalog.gpus import parse_gpus, resolve_gpu
from planner.core.specs import HostRateSpec
from planner.cost import overheads
from planner.engine.calibrate import fit, predict, scaled, solve_cpu_optimizer_rate, uncalibrated_gpu
from planner.engine.suggest import suggest
from planner.schema.suggest import SuggestRequest
from planner.strategies.rates import ASSUMED, FLAG, MEASURED, assumed_terms, cpu_optimizer_rate, rate_origin

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "benchmarks" / "results" / "H100-SXM-80"
RESTS = "speed rests on an assumed rate"


def plan_for(**request):
    from planner.engine.estimate import estimate
    from planner.schema.estimate import EstimateRequest

    return estimate(EstimateRequest(**request))


def test_the_h100_carries_the_rates_measured_beside_it_and_other_gpus_assume_them():
    h100 = parse_gpus("1xH100-80")
    assert rate_origin(h100, "cpu_optimizer_step", "deepspeed")[0] == MEASURED
    assert "2026-11-26-run7" in rate_origin(h100, "cpu_optimizer_step", "deepspeed")[1]
    assert cpu_optimizer_rate(h100, "deepspeed") == pytest.approx(1.76e9)  # median of 1.76, 2.53 and 1.41
    assert rate_origin(h100, "cpu_optimizer_step", "fsdp")[0] == MEASURED  # FSDP2's fused step: run 9
    assert cpu_optimizer_rate(h100, "fsdp") == pytest.approx(1.50e9)
    assert rate_origin(h100, "paged_migration", None)[0] == MEASURED
    assert assumed_terms(h100, "deepspeed") == () and assumed_terms(h100, "fsdp") == ()
    assert rate_origin(parse_gpus("1xA100-80"), "cpu_optimizer_step", "fsdp")[0] == ASSUMED
    assert cpu_optimizer_rate(parse_gpus("1xA100-80"), "fsdp") == overheads.CPU_OPTIMIZER_PARAMS_PER_SECOND_PER_NODE
    a100 = parse_gpus("1xA100-40")
    assert assumed_terms(a100, "deepspeed") == ("paged_migration", "cpu_optimizer_step")
    flagged = parse_gpus("1xA100-40", cpu_optimizer_gparams_s=3.0, page_migration_gb_s=10.0)
    assert rate_origin(flagged, "cpu_optimizer_step", "fsdp") == (FLAG, "") and assumed_terms(flagged, "fsdp") == ()


def test_only_an_assumed_rate_tags_a_plan_and_the_assumptions_say_where_each_came_from():
    offload = {"model": "meta-llama/Llama-3.2-1B", "micro_batch_size": 2, "seq_len": 2048, "sharding": "zero1",
               "offload": "optimizer"}
    measured = plan_for(gpus="1xH100-80", **offload)
    assert not any(RESTS in w for w in measured.warnings)
    assert any(a.startswith("CPU optimizer 1.8B params/s/node (measured in deepspeed beside this GPU")
               for a in measured.assumptions), measured.assumptions
    assumed = plan_for(gpus="1xA100-40", **offload)
    assert any(RESTS in w for w in assumed.warnings)
    assert "CPU optimizer 1B params/s/node (assumed; --cpu-optimizer-gparams-s)" in assumed.assumptions
    flagged = plan_for(gpus="1xA100-40", cpu_optimizer_gparams_s=2.0, **offload)
    assert not any(RESTS in w for w in flagged.warnings)
    assert "CPU optimizer 2B params/s/node (--cpu-optimizer-gparams-s)" in flagged.assumptions


def test_the_8b_h100_winner_rests_on_no_unmeasured_rate():
    """Issue 35's criterion: every exact plan of an 8B on one H100-80 steps its optimizer on the host
    or pages its state; the winner's rates are the ones measured beside that GPU."""
    result = suggest(SuggestRequest(model="meta-llama/Llama-3.1-8B", gpus="1xH100-80"))
    best = result.plans[0]
    assert best.config.offload != "none" or best.config.optimizer.startswith("paged")
    assert not any(RESTS in w for w in best.warnings), best.warnings
    assert any("measured in deepspeed beside this GPU" in a or "page migration" in a for a in result.assumptions)


@pytest.fixture(scope="module")
def run8_store(tmp_path_factory) -> Path:
    store = tmp_path_factory.mktemp("run8") / "calibration.sqlite"
    shutil.copy(RUNS / "2026-11-26-run8" / "calibration-H100-SXM-80.sqlite", store)
    store.chmod(0o644)
    return store


def test_the_cpu_step_rate_fitted_from_a_measured_offload_step_reproduces_it(run8_store):
    """Run 8's ZeRO-1 offload step (0.706 s): the fitted rate predicts exactly that step."""
    [m] = [m for m in CalibrationStore(run8_store).measurements() if m.config["offload"] == "optimizer"]
    p = predict(m)
    rate = solve_cpu_optimizer_rate(m, p)
    assert p.engine == "deepspeed" and rate == pytest.approx(2.53e9, rel=0.01)
    [c] = fit([x for x in CalibrationStore(run8_store).measurements() if x.status == "ok"])
    assert c.cpu_optimizer_params_per_s == {"deepspeed": pytest.approx(rate)}
    fitted = HostRateSpec(cpu_optimizer_params_per_s={"deepspeed": rate})
    again = predict(m, uncalibrated_gpu("H100-SXM-80").model_copy(update={"host_rates": fitted}))
    assert again.comparable_step_seconds == pytest.approx(m.median_step_seconds, rel=1e-9)


def test_calibrate_carries_the_host_rates_and_the_plan_then_uses_them(run8_store):
    from typer.testing import CliRunner

    from planner.cli import app

    out = CliRunner().invoke(app, ["calibrate", "--store", str(run8_store)], env={"COLUMNS": "80"})
    assert out.exit_code == 0, out.output
    assert "2.53B params/s" in out.output and "21.3 GB/s" in out.output  # the fitted and the carried rate
    c = CalibrationStore(run8_store).corrections("H100-SXM-80")
    assert c.host_rates.page_migration_bytes_per_s == pytest.approx(21.3e9, rel=0.01)
    gpu = resolve_gpu("H100-SXM-80", run8_store)
    assert gpu.host_rates.cpu_optimizer_params_per_s["deepspeed"] == pytest.approx(2.53e9, rel=0.01)
    assert gpu.host_rates.sources["page_migration"].startswith("calibration store")
    hw = parse_gpus("1xH100-80", calibration_store=run8_store)
    assert rate_origin(hw, "cpu_optimizer_step", "deepspeed")[1].startswith("calibration store")


def test_offload_rows_fit_the_cpu_rate_and_leave_the_flops_fit_alone():
    """A synthetic truth: the GPU's FLOP/s at x0.8 and the host's CPU step at 1.5B (DeepSpeed) and
    0.6B (FSDP2) parameters a second. The FLOP/s factor comes from the plain rows only, the rates
    from the offload rows."""
    from test_calibration import TRUTH, measurement

    truth = {"deepspeed": 1.5e9, "fsdp": 0.6e9}
    llama = "meta-llama/Llama-3.2-1B"
    plain = [measurement(llama, micro_batch_size=2, seq_len=2048),
             measurement(llama, micro_batch_size=4, seq_len=1024, checkpointing="full"),
             measurement(llama, micro_batch_size=1, seq_len=4096, checkpointing="selective")]
    offloaded = []
    for sharding, offload in (("zero1", "optimizer"), ("fsdp", "optimizer+params")):
        m = measurement(llama, micro_batch_size=2, seq_len=2048, sharding=sharding, offload=offload)
        p = predict(m, scaled(uncalibrated_gpu("H100-SXM-80"), {"bf16": TRUTH["bf16"]}))
        seconds = p.comparable_step_seconds - p.cpu_optimizer_seconds \
            + p.cpu_optimizer_seconds * p.cpu_optimizer_rate / truth[p.engine]
        offloaded.append(m.model_copy(update={"median_step_seconds": seconds, "step_seconds": [seconds] * 3}))
    [c] = fit(plain + offloaded)
    assert c.flops_scale["bf16"] == pytest.approx(TRUTH["bf16"], rel=0.02)
    assert c.report["time_rows_bf16"] == 3 and c.report["cpu_rows"] == {"deepspeed": 1, "fsdp": 1}
    for engine, rate in truth.items():
        assert c.cpu_optimizer_params_per_s[engine] == pytest.approx(rate, rel=0.03)


def test_the_assumptions_name_the_measurement_each_rate_came_from(run8_store, tmp_path):
    """With run 8's corrections the DeepSpeed rate is the calibration's; with a store fitted on no
    offload plan (the first H100 run) it stays the catalog's, and the line says which."""
    from planner.engine.calibrate import calibrate
    from planner.schema.calibrate import CalibrateRequest

    offload = {"model": "meta-llama/Llama-3.2-1B", "gpus": "1xH100-80", "micro_batch_size": 2, "seq_len": 2048,
               "sharding": "zero1", "offload": "optimizer"}
    calibrate(CalibrateRequest(store=run8_store))
    line = next(a for a in plan_for(calibration=run8_store, **offload).assumptions if a.startswith("CPU optimizer"))
    assert line.startswith("CPU optimizer 2.5B params/s/node (measured in deepspeed beside this GPU, calibrated;"), line
    first = tmp_path / "first.sqlite"
    shutil.copy(RUNS / "2026-11-26" / "calibration-H100-SXM-80.sqlite", first)
    first.chmod(0o644)
    calibrate(CalibrateRequest(store=first))
    line = next(a for a in plan_for(calibration=first, **offload).assumptions if a.startswith("CPU optimizer"))
    assert "beside this GPU, docs/measured.md;" in line, line
