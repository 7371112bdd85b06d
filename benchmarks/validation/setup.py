"""Phase A of the GPU validation: the machine's facts, a smoke test per library a case needs, the
device's ceilings (a bf16 and an fp8 matmul, a device-to-device copy) and the host-side rates
planner otherwise assumes (planner/probes/host_rates.py; ``--cpu``: torch's CPU AdamW only, small).

Every test runs in a forked child (probes/forked.py) with a timeout: a library that crashes or
hangs disables the cases that need it, and the run goes on. In ``--cpu`` mode the tests that need
CUDA are recorded as skipped, the rest run on the CPU.
"""

import json
import os
import platform
import subprocess
import time
from importlib import metadata

from planner.probes.forked import collect, run_forked, start_forked

#: Libraries whose versions the results depend on.
PACKAGES = ("torch", "transformers", "accelerate", "peft", "deepspeed", "bitsandbytes", "torchao", "liger-kernel",
            "triton", "optuna", "pydantic", "nvidia-ml-py", "tokenizers", "safetensors", "huggingface-hub")
SMOKE_SECONDS = 90.0


def facts() -> dict:
    """Versions, Python, CPU count and nvidia-smi's view of the GPU (no CUDA context here)."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    out = {"python": platform.python_version(), "platform": platform.platform(), "versions": versions}
    try:
        out["cpus"] = os.cpu_count()
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,memory.used,driver_version,"
                              "clocks.max.sm,power.limit,compute_mode", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        out["nvidia_smi"] = smi.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out["nvidia_smi"] = ""
    return out


# --- smoke tests: each returns a short description of what worked, or raises ------------------

def _bnb_8bit(device: str) -> str:
    import bitsandbytes as bnb
    import torch

    p = torch.nn.Parameter(torch.randn(4096, 1024, device=device))
    opt = bnb.optim.AdamW8bit([p])
    p.grad = torch.randn_like(p)
    opt.step()
    state = opt.state[p]["state1"]
    return f"AdamW8bit step, state1 {state.dtype}"


def _bnb_paged(device: str) -> str:
    import bitsandbytes as bnb
    import torch

    from planner.probes.gpu_readings import paged_bytes

    p = torch.nn.Parameter(torch.randn(1024, 1024, device=device))
    opt = bnb.optim.PagedAdamW8bit([p])
    p.grad = torch.randn_like(p)
    opt.step()
    return f"PagedAdamW8bit step, {paged_bytes()} paged bytes"


def _bnb_4bit(device: str) -> str:
    import bitsandbytes as bnb
    import torch

    layer = bnb.nn.Linear4bit(1024, 1024, compute_dtype=torch.bfloat16, quant_type="nf4").to(device)
    x = torch.randn(8, 1024, device=device, dtype=torch.bfloat16, requires_grad=True)
    layer(x).sum().backward()
    return f"Linear4bit nf4 forward+backward, weight {layer.weight.dtype}"


def _torchao_fp8(device: str) -> str:
    import torch
    from torchao.float8 import convert_to_float8_training

    if device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        raise RuntimeError("fp8 needs compute capability 8.9+")
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 1024)).to(device)
    convert_to_float8_training(model)
    x = torch.randn(64, 1024, device=device, requires_grad=True)
    with torch.autocast(device, dtype=torch.bfloat16):
        model(x).sum().backward()
    return f"Float8Linear forward+backward: {type(model[0]).__name__}"


def _liger(device: str) -> str:
    import torch
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    w = torch.randn(32000, 512, device=device, dtype=torch.bfloat16, requires_grad=True)
    h = torch.randn(256, 512, device=device, dtype=torch.bfloat16, requires_grad=True)
    y = torch.randint(0, 32000, (256,), device=device)
    loss = LigerFusedLinearCrossEntropyLoss()(w, h, y)
    loss.backward()
    return f"fused linear cross-entropy, loss {loss.item():.2f}"


def _deepspeed(device: str) -> str:
    import deepspeed

    return f"import deepspeed {deepspeed.__version__}"


def _peft(device: str) -> str:
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model

    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=256)
    with torch.device(device):
        model = get_peft_model(transformers.LlamaForCausalLM(cfg), LoraConfig(r=8, target_modules="all-linear"))
    ids = torch.randint(0, 256, (2, 16), device=device)
    model(input_ids=ids, labels=ids).loss.backward()
    return f"LoRA on a 2-layer Llama: {model.get_nb_trainable_parameters()[0]} trainable"


def _nvml(device: str) -> str:
    import torch

    from planner.probes.gpu_readings import nvml_process_bytes

    torch.ones(1, device=device)
    reading = nvml_process_bytes()
    if reading is None:
        raise RuntimeError("neither NVML nor nvidia-smi lists this process")
    return f"{reading[1]}: this process holds {reading[0] / 2**20:.0f} MiB"


def _cudart():
    """The CUDA runtime library this process already loaded (torch's), through ctypes."""
    import ctypes

    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libcudart" in line}
    if not paths:
        raise RuntimeError("no libcudart in this process")
    return ctypes.CDLL(sorted(paths)[0])


def _context(device: str) -> str:
    """What a process holds outside the caching allocator, stage by stage (issue 36): NVML's
    per-process bytes less torch's reserved bytes after the context exists, after a cuBLAS
    matmul, after SDPA forward and backward, after cross-entropy and a fused AdamW step; then the
    local-memory reservation (cudaLimitStackSize raised by 1 KiB per thread: the context reserves
    stack x resident threads per SM x SMs), and a one-rank NCCL process group with an all-reduce.
    Returns JSON: MiB per stage, the limits, SMs and threads per SM."""
    import ctypes
    import datetime

    import torch
    import torch.nn.functional as F

    from planner.probes.gpu_readings import nvml_process_bytes

    def held() -> float:
        torch.cuda.synchronize()
        reading = nvml_process_bytes()
        if reading is None:
            raise RuntimeError("NVML does not list this process")
        return round((reading[0] - torch.cuda.memory_reserved()) / 2**20, 1)

    props = torch.cuda.get_device_properties(0)
    out: dict = {"sms": props.multi_processor_count,
                 "threads_per_sm": getattr(props, "max_threads_per_multi_processor", None),
                 "module_loading": os.environ.get("CUDA_MODULE_LOADING", "(torch's default)"), "mib": {}}
    stages = out["mib"]
    torch.ones(1, device=device)
    stages["context"] = held()
    a = torch.randn(1024, 1024, device=device, dtype=torch.bfloat16)
    (a @ a).sum().item()
    stages["cublas_bf16_matmul"] = held()
    q = torch.randn(2, 8, 1024, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
    F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    stages["sdpa_fwd_bwd"] = held()
    w = torch.nn.Parameter(torch.randn(4096, 1024, device=device))
    F.cross_entropy(a.float() @ w.t(), torch.randint(0, 4096, (1024,), device=device)).backward()
    torch.optim.AdamW([w], fused=True).step()
    stages["cross_entropy_adamw"] = held()
    rt = _cudart()
    limits = {}
    for name, code in (("stack", 0), ("printf_fifo", 1), ("malloc_heap", 2)):
        value = ctypes.c_size_t()
        if rt.cudaDeviceGetLimit(ctypes.byref(value), code) == 0:
            limits[name] = value.value
    out["limits"] = limits
    if "stack" in limits and rt.cudaDeviceSetLimit(0, ctypes.c_size_t(limits["stack"] + 1024)) == 0:
        torch.ones(1, device=device).sum().item()
        stages["stack_plus_1kib"] = held()
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0),
                            timeout=datetime.timedelta(seconds=20))
    t = torch.ones(1 << 20, device=device)
    dist.all_reduce(t)
    stages["nccl_world1_all_reduce"] = held()
    dist.destroy_process_group()
    return json.dumps(out, separators=(",", ":"))


#: name -> (test, needs CUDA)
SMOKE_TESTS = {"bnb_8bit": (_bnb_8bit, False), "bnb_paged": (_bnb_paged, True), "bnb_4bit": (_bnb_4bit, False),
               "torchao_fp8": (_torchao_fp8, True), "liger": (_liger, True), "deepspeed": (_deepspeed, False),
               "peft": (_peft, False), "nvml": (_nvml, True),
               "context": (_context, True)}


def _smoke_child(payload: str) -> str:
    name, device = json.loads(payload)
    return SMOKE_TESTS[name][0](device)


def smoke_tests(device: str, deadline: float) -> dict[str, dict]:
    """Every smoke test at once, each in its own forked child: {name: {ok, detail, seconds}}; a
    test still running at ``deadline`` (monotonic seconds) is killed and fails."""
    out, running = {}, {}
    for name, (_, needs_cuda) in SMOKE_TESTS.items():
        if needs_cuda and device != "cuda":
            out[name] = {"ok": False, "detail": "skipped: needs CUDA", "seconds": 0.0}
        else:
            running[name] = start_forked(_smoke_child, json.dumps([name, device]))
    end = time.perf_counter() + min(SMOKE_SECONDS, deadline - time.monotonic())
    for name, child in running.items():
        outcome = collect(child, end)
        ok = outcome.status == "ok"
        detail = outcome.value if ok else outcome.describe()[-600:]
        out[name] = {"ok": ok, "detail": str(detail), "seconds": round(outcome.seconds, 2)}
        print(f"  smoke {name:12s} {'ok  ' if ok else 'FAIL'} {outcome.seconds:5.1f} s  {str(detail)[:90]}",
              flush=True)
    return {name: out[name] for name in SMOKE_TESTS}


# --- ceilings --------------------------------------------------------------------------------

def _ceilings_child(payload: str) -> dict:
    """Median of timed bf16 and fp8 matmuls (8192^3, FLOP/s) and a 4 GiB copy (bytes read +
    written per second), with CUDA events after warm-up; random data (never zeros)."""
    import torch

    n, out = 8192, {}

    def timed(fn, repeats=10) -> float:
        for _ in range(3):
            fn()
        times = []
        for _ in range(repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        return sorted(times)[len(times) // 2]

    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    out["bf16_matmul_tflops"] = 2 * n**3 / timed(lambda: x @ y) / 1e12
    if torch.cuda.get_device_capability() >= (8, 9):
        xf, yf = x.to(torch.float8_e4m3fn), y.to(torch.float8_e4m3fn).t().contiguous().t()
        one = torch.ones((), device="cuda")
        out["fp8_matmul_tflops"] = 2 * n**3 / timed(
            lambda: torch._scaled_mm(xf, yf, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)) / 1e12
    del x, y
    src = torch.empty(1 << 31, device="cuda", dtype=torch.int16).random_()
    dst = torch.empty_like(src)
    out["copy_gbps"] = 2 * src.nbytes / timed(lambda: dst.copy_(src), repeats=5) / 1e9
    out["device"] = torch.cuda.get_device_name()
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in out.items()}


def _host_rate_child(payload: str) -> dict:
    from planner.probes.host_rates import measure

    name, device = json.loads(payload)
    if device == "cuda":
        return measure((name,))[name]
    return measure((name,), cuda=False, params=1 << 22)[name]


def host_rates(device: str, deadline: float) -> dict:
    """planner/probes/host_rates.py, each rate in its own forked child (it owns the GPU; a crash
    in one library loses only its rate), until ``deadline`` (monotonic seconds): each rate's
    figures or why it was not measured. ``--cpu``: torch's CPU AdamW only, small."""
    from planner.probes.host_rates import MEASUREMENTS

    out: dict[str, dict] = {}
    for name in MEASUREMENTS if device == "cuda" else ("torch_cpu_adamw",):
        left = deadline - time.monotonic()
        if left < 5:
            out[name] = {"error": "skipped: no time left in phase A"}
        else:
            outcome = run_forked(_host_rate_child, json.dumps([name, device]), left)
            out[name] = outcome.value if outcome.status == "ok" else {"error": outcome.describe()[-600:]}
        shown = {k: (f"{v:.3g}" if isinstance(v, float) else v) for k, v in out[name].items()}
        print(f"  host rate {name}: {shown}", flush=True)
    return out


def store_host_rates(store, device_gpu: str, info, env: dict) -> None:
    """The measured host rates into the run's calibration store (``planner calibrate`` carries
    them into the GPU's corrections)."""
    from datetime import datetime, timezone

    from planner.catalog.calibration import CalibrationStore, HostRates

    figures = env.get("host_rates") or {}
    rates = HostRates.from_measured(device_gpu, info.name, env["facts"].get("cpus"), figures,
                                    datetime.now(timezone.utc).isoformat(timespec="seconds"))
    CalibrationStore(store).save_host_rates(rates)
    env["host_rates_stored"] = rates.model_dump()


def ceilings(device: str) -> dict:
    if device != "cuda":
        return {"skipped": "needs CUDA"}
    outcome = run_forked(_ceilings_child, "", 60)
    return outcome.value if outcome.status == "ok" else {"error": outcome.describe()[-600:]}
