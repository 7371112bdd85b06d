"""Calibration: the store, the fit of measured probes, and the analytic model using the fit.

CPU only: the "measured" figures are synthesised from the analytic model with a known truth
(context, fragmentation, FLOP/s factors), so the fit must give that truth back.
"""

import json
import math
import sqlite3

import pytest
from typer.testing import CliRunner

from planner.catalog.calibration import (
    CalibrationStore,
    Corrections,
    Measurement,
    store_path,
)
from planner.catalog.models import model_config, resolve_model
from planner.cli import app
from planner.core.errors import PlannerInputError
from planner.core.units import GIB, MIB
from planner.cost import overheads
from planner.engine.calibrate import fit, predict, scaled, uncalibrated_gpu
from planner.engine.estimate import FRAGMENTATION_LABEL, estimate
from planner.schema.estimate import EstimateRequest
from planner.strategies import TrainingConfig, reserve_extra

GPU = "H100-SXM-80"
CONTEXT = int(1.4 * GIB)
FRAGMENTATION = 0.08
TRUTH = {"bf16": 0.8, "fp8": 0.9}  # factors on the catalog's achieved FLOP/s
VERSIONS = {"torch": "2.11.0", "cuda": "13.0", "transformers": "4.57.0"}
runner = CliRunner()


def measurement(model: str = "meta-llama/Llama-3.2-1B", *, layers: int | None = None, world_size: int = 1,
                target: str = f"1x{GPU}", communication: str = "none", versions: dict = VERSIONS,
                status: str = "ok", **config) -> Measurement:
    """A measurement of a real catalog plan whose figures follow TRUTH exactly."""
    bare = Measurement(
        model=model, config_json=model_config(model), layers=layers,
        config=TrainingConfig(**config).model_dump(mode="json"), world_size=world_size, target_gpus=target,
        device_gpu=GPU, device_name="NVIDIA H100 80GB HBM3", versions=versions, status=status,
        communication=communication, created="2026-01-01T00:00:00+00:00",
    )
    allocated = predict(bare).allocated_bytes
    # the truth's reserve: the base fraction, what the plan's techniques add (strategies ``reserve``), the stream pools
    reserved = round(allocated * (1 + FRAGMENTATION + reserve_extra(TrainingConfig(**config)))) + predict(bare).pool_bytes
    seconds = predict(bare, scaled(uncalibrated_gpu(GPU), TRUTH)).comparable_step_seconds
    return bare.model_copy(update={
        "max_allocated_bytes": allocated, "max_reserved_bytes": reserved, "driver_used_bytes": reserved + CONTEXT,
        "median_step_seconds": seconds, "step_seconds": [seconds] * 3,
    })


@pytest.fixture(scope="module")
def measurements() -> list[Measurement]:
    llama, qwen = "meta-llama/Llama-3.2-1B", "Qwen/Qwen2.5-0.5B"
    return [
        measurement(llama, micro_batch_size=2, seq_len=2048),
        measurement(llama, micro_batch_size=4, seq_len=1024, checkpointing="full"),
        measurement(llama, micro_batch_size=1, seq_len=4096, precision="bf16-pure"),
        measurement(qwen, micro_batch_size=8, seq_len=2048, checkpointing="selective"),
        measurement(qwen, micro_batch_size=4, seq_len=2048, precision="bf16-pure"),
        measurement(llama, layers=4, world_size=8, target=f"8x{GPU}", communication="modelled", sharding="fsdp",
                    micro_batch_size=4, seq_len=2048),
        measurement(llama, micro_batch_size=2, seq_len=2048, precision="fp8-mixed"),
        measurement(qwen, micro_batch_size=8, seq_len=2048, precision="fp8-mixed"),
        measurement(llama, micro_batch_size=4, seq_len=2048, precision="fp8-mixed", checkpointing="full"),
    ]


@pytest.fixture
def store_env(tmp_path, monkeypatch):
    """A calibration store at a tmp file that planner estimate reads (PLANNER_CALIBRATION)."""
    path = tmp_path / "calibration.sqlite"
    monkeypatch.setenv("PLANNER_CALIBRATION", str(path))
    return path


def corrections(**kw) -> Corrections:
    fields = {"gpu": GPU, "software": "torch=2.11.0", "measurements": 9, "context_bytes": CONTEXT,
              "fragmentation_fraction": FRAGMENTATION, "flops_scale": {"bf16": 0.8},
              "fitted_at": "2026-01-01T00:00:00+00:00"}
    return Corrections(**(fields | kw))


# --- the store ----------------------------------------------------------------------------------

def test_store_keeps_the_latest_per_key_and_separates_software(tmp_path):
    store = CalibrationStore(tmp_path / "nested" / "calibration.sqlite")
    m = measurement(micro_batch_size=2, seq_len=1024)
    store.add(m)
    store.add(m.model_copy(update={"max_allocated_bytes": 123, "created": "2026-01-02T00:00:00+00:00"}))
    assert [x.max_allocated_bytes for x in store.measurements()] == [123]  # same key: replaced, latest kept
    store.add(m.model_copy(update={"versions": VERSIONS | {"torch": "2.12.0"}}))
    assert len(store.measurements()) == 2  # another torch: a row of its own
    assert len(store.measurements(GPU)) == 2 and store.measurements("A100-SXM-40") == []
    assert {x.software_key for x in store.measurements()} == {m.software_key, m.model_copy(
        update={"versions": VERSIONS | {"torch": "2.12.0"}}).software_key}


def test_corrections_round_trip(tmp_path):
    store = CalibrationStore(tmp_path / "calibration.sqlite")
    assert store.corrections(GPU) is None
    c = corrections(report={"memory_median_error_before": 0.04, "rows": 9})
    store.save_corrections(c)
    assert store.corrections(GPU) == c
    store.save_corrections(c.model_copy(update={"context_bytes": 5}))
    assert store.corrections(GPU).context_bytes == 5  # one row per GPU: the latest fit


def test_reading_never_writes(tmp_path):
    missing = CalibrationStore(tmp_path / "missing.sqlite")
    assert missing.measurements() == [] and missing.corrections(GPU) is None
    assert not missing.path.exists()  # reading does not create the store
    empty = tmp_path / "empty.sqlite"
    sqlite3.connect(empty).close()  # a SQLite file without the store's tables
    assert CalibrationStore(empty).corrections(GPU) is None
    with sqlite3.connect(empty) as con:
        assert con.execute("SELECT name FROM sqlite_master").fetchall() == []  # still no tables


def test_unwritable_store_is_a_user_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(PlannerInputError) as e:
        CalibrationStore(blocker / "calibration.sqlite").add(measurement(micro_batch_size=1, seq_len=512))
    assert "PLANNER_CALIBRATION" in e.value.hint


def test_store_path_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PLANNER_CALIBRATION", "off")
    assert store_path() is None
    monkeypatch.setenv("PLANNER_CALIBRATION", str(tmp_path / "x.sqlite"))
    assert store_path() == tmp_path / "x.sqlite"


# --- predict ------------------------------------------------------------------------------------

def test_predict_splits_the_peak_into_allocated_context_and_reserve():
    p = predict(measurement(micro_batch_size=2, seq_len=2048))
    assert p.nccl_bytes == 0 and (p.nodes, p.gpus_per_node) == (1, 1)
    # allocated + context + reserve = peak, with the assumptions of planner/cost/overheads.py
    # (a ledger row's bytes are rounded up: planner/core/ledger.py RowDraft.bytes)
    # and the holes the ledger names (the standard loss's 16-bit logits: strategies/loss.py)
    assert p.pool_bytes == 2 * 2048 * 128_256 * 2
    assert p.peak_bytes == (p.allocated_bytes + overheads.cuda_context_bytes(uncalibrated_gpu(GPU)) + p.pool_bytes
                            + math.ceil(p.allocated_bytes * overheads.FRAGMENTATION_FRACTION))


def test_predict_leaves_out_modelled_communication():
    """DDP adds only communication to the single-GPU step: without it, 16 ranks step like one."""
    ddp = measurement(world_size=16, target=f"2x8x{GPU}", communication="modelled", sharding="ddp",
                      micro_batch_size=1, seq_len=256)
    single = measurement(micro_batch_size=1, seq_len=256)
    p, q = predict(ddp), predict(single)
    assert (p.nodes, p.gpus_per_node) == (2, 8)
    assert p.nccl_bytes == overheads.NCCL_BYTES and p.comparable_peak_bytes == p.peak_bytes - overheads.NCCL_BYTES
    assert p.step_seconds > 2 * p.step_seconds_without_communication  # this plan's all-reduce is exposed
    assert p.comparable_step_seconds == p.step_seconds_without_communication
    assert p.step_seconds_without_communication == pytest.approx(q.step_seconds, rel=1e-9)
    assert q.comparable_step_seconds == q.step_seconds  # one GPU: nothing to leave out


def test_predict_never_uses_the_stores_corrections(store_env):
    m = measurement(micro_batch_size=2, seq_len=2048)
    before = predict(m)
    CalibrationStore(store_env).save_corrections(corrections())
    assert predict(m) == before


# --- fit ----------------------------------------------------------------------------------------

def test_fit_recovers_the_truth(measurements):
    [c] = fit(measurements)
    assert c.gpu == GPU and c.measurements == len(measurements)
    assert abs(c.context_bytes - CONTEXT) <= MIB
    assert c.fragmentation_fraction == pytest.approx(FRAGMENTATION, abs=1e-3)
    assert set(c.flops_scale) == {"bf16", "fp8"}
    for dtype, factor in TRUTH.items():
        assert c.flops_scale[dtype] == pytest.approx(factor, rel=0.02)
    r = c.report
    assert r["rows"] == 9 and r["time_rows_bf16"] == 6 and r["time_rows_fp8"] == 3 and r["time_rows_clamped"] == 0
    for quantity in ("memory", "time"):
        assert r[f"{quantity}_median_error_after"] < r[f"{quantity}_median_error_before"]
        assert r[f"{quantity}_worst_error_after"] < r[f"{quantity}_worst_error_before"]
        assert r[f"{quantity}_median_error_loo"] < r[f"{quantity}_median_error_before"]
    assert r["time_median_error_before"] > 0.1  # the truth is 20% slower than the catalog: before must show it
    assert c.software == measurements[0].software_key and c.fitted_at.endswith("+00:00")


def test_fit_skips_failed_and_cpu_runs_and_needs_three_rows_per_term(measurements):
    failed = measurements[0].model_copy(update={"status": "oom", "max_allocated_bytes": 1})
    cpu = measurements[1].model_copy(update={"device_gpu": "cpu"})
    assert fit([failed, cpu]) == []
    [c] = fit([*measurements[:2], failed, cpu])  # two ok rows: too few for any term
    assert c.measurements == 2
    assert c.context_bytes is None and c.fragmentation_fraction is None and c.flops_scale == {}
    [c] = fit(measurements[:5])  # five bf16 rows, no fp8
    assert set(c.flops_scale) == {"bf16"}


def test_fit_clamps_impossible_times(measurements):
    slow = [m.model_copy(update={"median_step_seconds": 1e3}) for m in measurements[:3]]
    [c] = fit(slow)
    assert c.flops_scale == {"bf16": pytest.approx(1 / 20)} and c.report["time_rows_clamped"] == 3


# --- the analytic model uses the corrections and says so -----------------------------------------

def test_estimate_uses_stored_corrections_and_says_so(store_env):
    """The store a request names (``calibration``; the CLI's --calibration) applies; nothing reads
    the environment below the command line, so a request without one stays uncalibrated."""
    request = EstimateRequest(model="meta-llama/Llama-3.2-1B", gpus=f"1x{GPU}", calibration=store_env)
    plain = estimate(request)
    assert plain.hardware.calibration is None
    CalibrationStore(store_env).save_corrections(corrections())
    calibrated = estimate(request)
    assert calibrated.hardware.calibration and "calibrated on 9 measured probes" in calibrated.hardware.calibration
    rows = {r.term: r for r in calibrated.ledger if r.term != "allocator_reserve"}
    assert rows["cuda_context"].bytes == CONTEXT
    [reserve] = [r for r in calibrated.ledger if r.label == FRAGMENTATION_LABEL]
    holes = sum(r.bytes for r in calibrated.ledger if r.term == "allocator_reserve") - reserve.bytes
    allocated = calibrated.memory["peak"] - CONTEXT - reserve.bytes - holes
    assert reserve.bytes == pytest.approx(FRAGMENTATION * allocated, abs=1)
    assert calibrated.time.step_seconds > plain.time.step_seconds  # 0.8 x the achieved FLOP/s: slower
    assert calibrated.memory["peak"] - plain.memory["peak"] == pytest.approx(
        CONTEXT - overheads.cuda_context_bytes(uncalibrated_gpu(GPU))
        + (FRAGMENTATION - overheads.FRAGMENTATION_FRACTION) * allocated, abs=2)
    assert estimate(request.model_copy(update={"calibration": None})) == plain  # $PLANNER_CALIBRATION is not read
    other = EstimateRequest(model="meta-llama/Llama-3.2-1B", gpus="1xA100-40")
    assert estimate(other.model_copy(update={"calibration": store_env})) == estimate(other)  # none for the A100


def test_cli_estimate_prints_the_calibration(store_env):
    CalibrationStore(store_env).save_corrections(corrections())
    r = runner.invoke(app, ["estimate", "--model", "meta-llama/Llama-3.2-1B", "--gpus", f"1x{GPU}"])
    assert r.exit_code == 0, r.output
    assert "calibration:" in r.output and "calibrated on 9 measured probes" in r.output


# --- planner calibrate --------------------------------------------------------------------------

def _invoke(*args):
    r = runner.invoke(app, ["calibrate", *args])
    assert "Traceback" not in r.output and (r.exception is None or isinstance(r.exception, SystemExit)), r.output
    return r


def test_cli_calibrate_fits_saves_and_is_then_used(store_env, measurements):
    store = CalibrationStore(store_env)
    for m in measurements:
        store.add(m)
    r = _invoke("--store", str(store_env))
    assert r.exit_code == 0, r.output
    assert GPU in r.output and "leave-one-out" in r.output and "now use them" in r.output
    saved = store.corrections(GPU)
    assert saved is not None and saved.flops_scale["bf16"] == pytest.approx(0.8, rel=0.02)
    assert estimate(EstimateRequest(model="Qwen/Qwen2.5-0.5B", gpus=f"1x{GPU}", calibration=store_env)).hardware.calibration


def test_cli_calibrate_dry_run_and_json_save_nothing(tmp_path, measurements):
    path = tmp_path / "elsewhere.sqlite"
    store = CalibrationStore(path)
    for m in measurements:
        store.add(m)
    r = _invoke("--store", str(path), "--dry-run", "--json", "--gpu", "h100")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["saved"] is False and out["in_use"] is False and out["measurements"] == len(measurements)
    assert out["corrections"][0]["gpu"] == GPU and "memory_median_error_loo" in out["corrections"][0]["report"]
    assert store.corrections(GPU) is None


@pytest.mark.parametrize("case", ["missing", "empty", "other-gpu", "off"])
def test_cli_calibrate_without_measurements_exits_2(tmp_path, monkeypatch, measurements, case):
    path = tmp_path / "calibration.sqlite"
    args = ["--store", str(path)]
    if case == "empty":
        sqlite3.connect(path).close()
    elif case == "other-gpu":
        CalibrationStore(path).add(measurements[0])
        args += ["--gpu", "A100-40"]
    elif case == "off":
        monkeypatch.setenv("PLANNER_CALIBRATION", "off")
        args = []
    r = _invoke(*args)
    assert r.exit_code == 2, r.output
    said = " ".join(r.output.split())  # rich wraps the message at the terminal's width
    assert "planner probe --fidelity measured" in said
    if case == "other-gpu":
        assert "A100-SXM-40" in said and GPU in said  # says which GPUs it does hold


def test_cli_calibrate_with_no_ok_measurement_exits_1(tmp_path, measurements):
    path = tmp_path / "calibration.sqlite"
    CalibrationStore(path).add(measurements[0].model_copy(update={"status": "oom"}))
    r = _invoke("--store", str(path))
    assert r.exit_code == 1, r.output
    assert "nothing to fit" in r.output
    assert CalibrationStore(path).corrections(GPU) is None


def test_kind_floor_only_drops_for_a_store_with_corrections(tmp_path):
    """Nothing fits: the screen that skips larger GPU kinds holds for any store without fitted
    corrections (the CLI always names the default store, which usually does not exist) and is
    dropped once one kind's context or reserve is fitted."""
    from planner.engine.nothing_fits import Prober
    from planner.schema.suggest import SuggestRequest

    path = tmp_path / "calibration.sqlite"
    request = SuggestRequest(model="meta-llama/Llama-3.1-8B", gpus="1xT4-16", seq_len=2048, calibration=path)
    floor = Prober(request, resolve_model(request.model)).kind_floor(request.hardware())
    assert 0 < floor < float("inf")
    CalibrationStore(path).add(measurement())  # measurements without a fit: still the bound
    assert Prober(request, resolve_model(request.model)).kind_floor(request.hardware()) == floor
    CalibrationStore(path).save_corrections(corrections())
    assert Prober(request, resolve_model(request.model)).kind_floor(request.hardware()) == 0
