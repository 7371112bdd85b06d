"""The emitted launch runs the plan: on the CPU, ``launch.sh`` trains a tiny model folder (weights and
tokenizer, as a user has one) on planner's sample text for two steps through the real entry point
(``python -m planner.launch`` under ``accelerate launch``), and the live objects of the run
(planner/launch/live.py: optimizer class and state dtypes, parameter dtype and accelerate's mixed
precision, checkpoint wrappers, DeepSpeed stage and offload, FSDP2 reshard and offload, loss,
attention, batch shape and batching, the peft adapter: kind, rank, targets, alpha, dropout, trainable parameters)
equal the plan, field by field, on every rank. QLoRA's 4-bit base runs through bitsandbytes' CPU
backend.

One process, DDP and FSDP2 run over gloo with ACCELERATE_USE_CPU=1; DeepSpeed brings up gloo
itself (planner/launch/cpu.py), Ulysses sequence parallelism included (accelerate's
parallelism_config over two ranks: the live sp_size and a rank's positions x sp_size are the plan's). ZeRO-Offload builds DeepSpeed's CPU Adam (a C++ extension, about
50 s on 2 cores) into the test's own folder, so no build is left behind. Hybrid FSDP runs as two
machines (a launch.sh per MACHINE_RANK) on this host, 2 x 2 processes. Not run here, because the
CPU cannot: Liger's chunked loss (Triton kernels, CUDA), paged memory (bitsandbytes falls back to
unpaged state on the CPU; the class is still checked: paged-adamw, paged-adamw-8bit). ZeRO with fp16
is skipped, with the reason, where DeepSpeed's CPU accelerator says the CPU has no fp16.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.emit import build_files, single_plan_result, write_files
from planner.strategies.precision import Precision
from planner.strategies.sharding import Engine, engine_of

from helpers import FULL, run

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "tests" / "data" / "tiny-llama")
SHAPE = dict(micro_batch_size=2, grad_accum=2, seq_len=64)
ALL_CASES = [
    # name, gpus, config, processes
    ("single-adamw-full", "1xA100-80", dict(precision="bf16-mixed", checkpointing="full"), 1),
    ("single-pure-adam-mini-selective", "1xA100-80", dict(precision="bf16-pure", optimizer="adam-mini",
                                                          checkpointing="selective"), 1),
    ("single-fp32-adafactor-eager", "1xA100-80", dict(precision="fp32", optimizer="adafactor", attention="eager"), 1),
    ("single-lion-8bit", "1xA100-80", dict(precision="bf16-mixed", optimizer="lion-8bit"), 1),
    ("single-paged-adamw", "1xA100-80", dict(precision="bf16-mixed", optimizer="paged-adamw"), 1),
    ("single-lion-fp16", "1xA100-80", dict(precision="fp16-mixed", optimizer="lion"), 1),
    ("single-paged-adamw-8bit-fp16", "1xA100-80", dict(precision="fp16-mixed", optimizer="paged-adamw-8bit"), 1),
    ("ddp-adamw-8bit-selective", "2xA100-80", dict(sharding="ddp", optimizer="adamw-8bit", checkpointing="selective"), 2),
    ("fsdp-torchao-8bit-full", "2xA100-80", dict(sharding="fsdp", optimizer="adamw-8bit", checkpointing="full"), 2),
    ("fsdp-grad-op-offload", "2xA100-80", dict(sharding="fsdp-grad-op", offload="optimizer+params",
                                               gradient_sync="step"), 2),
    ("zero1-sgd", "2xA100-80", dict(sharding="zero1", optimizer="sgd"), 2),
    ("zero3-full", "2xA100-80", dict(sharding="zero3", checkpointing="full"), 2),
    ("zero2-fp16-offload-optimizer", "2xA100-80", dict(sharding="zero2", precision="fp16-mixed", offload="optimizer"), 2),
    ("zero3-offload-optimizer", "2xA100-80", dict(sharding="zero3", offload="optimizer"), 2),
    ("fsdp-hybrid-two-machines", "2x2xA100-80", dict(sharding="fsdp-hybrid"), 4),
    ("single-fp8-compiled", "1xH100-80", dict(precision="fp8-mixed"), 1),
    ("ddp-dora-attention", "2xA100-80", dict(sharding="ddp", adapter="dora", lora_targets="attention", lora_alpha=16,
                                             lora_rank=8, lora_dropout=0.0), 2),
    ("fsdp-qlora", "2xA100-80", dict(sharding="fsdp", adapter="qlora", checkpointing="full"), 2),
    ("zero3-lora-full", "2xA100-80", dict(sharding="zero3", adapter="lora", checkpointing="full"), 2),
    ("zero3-qlora-full", "2xA100-80", dict(sharding="zero3", adapter="qlora", checkpointing="full"), 2),
    ("zero2-qlora", "2xA100-80", dict(sharding="zero2", adapter="qlora"), 2),
    ("zero1-lora-int8-full", "2xA100-80", dict(sharding="zero1", adapter="lora-int8", checkpointing="full"), 2),
    # activation-checkpoint offload: the Trainer's (save_on_cpu around transformers' checkpoint) and
    # accelerate's FSDP2 one (torch's OffloadWrapper around each checkpointed layer)
    ("single-ckpt-offload", "1xA100-80", dict(checkpointing="full", checkpoint_offload="host"), 1),
    ("fsdp-ckpt-offload", "2xA100-80", dict(sharding="fsdp", checkpointing="full", checkpoint_offload="host"), 2),
    ("single-padded", "1xA100-80", dict(batching="padded"), 1),  # one document a row, padded to the batch's longest
    # DeepSpeed's TiledMLP, four tiles of the tiny model's 256 positions (its width is 64)
    ("single-tiled-mlp", "1xA100-80", dict(precision="bf16-pure", checkpointing="full", tiled_mlp="tiled", seq_len=256),
     1),
    ("zero3-tiled-mlp", "2xA100-80", dict(sharding="zero3", checkpointing="full", tiled_mlp="tiled", seq_len=256), 2),
    # a QLoRA base prepared as TRL <= 0.25 prepares it (fp32 norms): the launch applies what runtime.json says
    ("single-qlora-kbit-prep", "1xA100-80", dict(adapter="qlora", kbit_prep="fp32-norms", checkpointing="full"), 1),
    # DPO through TRL's DPOTrainer: a reference copy; LoRA's adapter-disabled base; precomputed log-probabilities
    ("single-dpo", "1xA100-80", dict(method="dpo", batching="padded"), 1),
    # KTO through TRL's KTOTrainer: a reference copy, the KL estimate's forwards; LoRA's disabled base
    ("single-kto", "1xA100-80", dict(method="kto", batching="padded"), 1),
    ("ddp-kto-lora-precomputed", "2xA100-80", dict(method="kto", batching="padded", sharding="ddp", adapter="lora",
                                                   dpo_reference="precomputed", kto_loss="apo-zero-unpaired"), 2),
    # GRPO with a generation batch of two steps' completions, each used twice (num_iterations)
    ("single-grpo", "1xA100-80", dict(method="grpo", batching="padded", generation="transformers", completion_len=16,
                                      num_generations=2, generation_batch_size=8, num_iterations=2), 1),
    # DDP, DoRA on the attention projections, GRPO with a generation batch of two steps' completions,
    # each used twice (num_iterations)
    ("ddp-grpo-dora-attention", "2xA100-80", dict(method="grpo", batching="padded", sharding="ddp", adapter="dora",
                                                  lora_targets="attention", lora_alpha=16, lora_rank=8,
                                                  lora_dropout=0.0, generation="transformers", completion_len=16,
                                                  num_generations=2, generation_batch_size=16, num_iterations=2),
     2),
    ("ddp-grpo-lora-beta", "2xA100-80", dict(method="grpo", batching="padded", sharding="ddp", adapter="lora",
                                             generation="transformers", completion_len=16, num_generations=4,
                                             kl_beta=0.04), 2),
    ("zero2-grpo-beta", "2xA100-80", dict(method="grpo", batching="padded", sharding="zero2", kl_beta=0.04,
                                          generation="transformers", completion_len=16, num_generations=2), 2),
    ("zero3-grpo-beta", "2xA100-80", dict(method="grpo", batching="padded", sharding="zero3", kl_beta=0.04,
                                          generation="transformers", completion_len=16, num_generations=2), 2),
    ("zero3-dpo", "2xA100-80", dict(method="dpo", batching="padded", sharding="zero3"), 2),
    ("fsdp-dpo", "2xA100-80", dict(method="dpo", batching="padded", sharding="fsdp"), 2),
    ("fsdp-grpo-beta", "2xA100-80", dict(method="grpo", batching="padded", sharding="fsdp", kl_beta=0.04,
                                         generation="transformers", completion_len=16, num_generations=2), 2),
    ("ddp-dpo-lora", "2xA100-80", dict(method="dpo", batching="padded", sharding="ddp", adapter="lora"), 2),
    ("zero2-dpo-precomputed", "2xA100-80", dict(method="dpo", batching="padded", sharding="zero2",
                                                 dpo_reference="precomputed"), 2),
    # Ulysses sequence parallelism over both ranks (one replica): accelerate's parallelism_config.
    # Micro-batches of one row: DeepSpeed's data loader adapter slices each row's positions, and
    # only a move to the GPU makes a slice of several rows contiguous (transformers' loss views it)
    ("zero3-ulysses", "2xA100-80", dict(sharding="zero3", sequence_parallel="ulysses", sp_size=2,
                                        micro_batch_size=1, grad_accum=4), 2),
    # the same with one sample a row, each padded to its length rounded up to a multiple of 2
    ("zero3-ulysses-padded", "2xA100-80", dict(sharding="zero3", sequence_parallel="ulysses", sp_size=2,
                                               batching="padded", micro_batch_size=1, grad_accum=4), 2),
    # Ulysses with the MLPs tiled: each rank's 128 positions of a 256-token row in two tiles
    ("zero3-ulysses-tiled-mlp", "2xA100-80", dict(sharding="zero3", sequence_parallel="ulysses", sp_size=2,
                                                  checkpointing="full", tiled_mlp="tiled", seq_len=256,
                                                  micro_batch_size=1, grad_accum=4), 2),
    # transformers' tensor parallelism over two ranks, FSDP2 over two such groups (DistributedConfig at load),
    # the runtime's selective checkpointing around each DTensor layer
    ("fsdp-tp2", "4xA100-80", dict(sharding="fsdp", tensor_parallel="transformers", tp_size=2,
                                   checkpointing="selective"), 4),
    ("fsdp-tp2-pure-full", "4xA100-80", dict(sharding="fsdp", tensor_parallel="transformers", tp_size=2,
                                             precision="bf16-pure", checkpointing="full", gradient_sync="step"), 4),
]  # (LoRA and QLoRA on one GPU: test_the_adapter_plan_suggested_for_an_rtx_4090_trains)
#: CI's launches: one per distributed engine (DDP, FSDP2, ZeRO-3), each with an adapter (DoRA,
#: QLoRA), a TRL trainer (GRPO over DDP with DoRA: its generation batch, its completions reused), a
#: layout of several GPUs per replica each way (Ulysses; tensor
#: parallelism with transformers' FSDP2); the CPU launch of tests/test_gpu_validate.py runs one
#: process (AdamW, full checkpointing). The full suite (helpers.FULL) launches every case: each
#: other optimizer, fp16 and fp8, offload (DeepSpeed's CPU Adam is a C++ build of minutes), hybrid
#: FSDP over two machines, padded batching, DPO and KTO, checkpoint offload, the tiled MLP, ZeRO-3
#: QLoRA (its 4-bit base in the 16-bit quant storage), the adapter plans suggested for an RTX 4090.
CI_CASES = ("ddp-grpo-dora-attention", "fsdp-qlora", "zero3-ulysses", "fsdp-tp2")
CASES = [pytest.param(*c, id=c[0], marks=() if c[0] in CI_CASES else FULL) for c in ALL_CASES]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    sys.path.insert(0, str(ROOT / "tests" / "tools"))
    from tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.mark.heavy
@pytest.mark.parametrize("name, gpus, config, processes", CASES)
def test_launch_runs_the_plan(tmp_path, tmp_path_factory, tiny_model, monkeypatch, name, gpus, config, processes):
    plan = run(TINY, gpus, **(dict(precision="bf16-mixed") | SHAPE | config))
    assert plan.feasible, plan.reasons
    _skip_where_deepspeed_refuses_fp16(plan, monkeypatch)
    _launch_equals_plan(plan, tmp_path, tmp_path_factory, tiny_model, 29700 + 7 * [c[0] for c in ALL_CASES].index(name),
                        processes)


@FULL
@pytest.mark.parametrize("adapter", ["lora", "qlora", "lora-int8"])
def test_the_adapter_plan_suggested_for_an_rtx_4090_trains(tmp_path, tmp_path_factory, tiny_model, adapter):
    """The issue's case: ``planner suggest --model meta-llama/Llama-3.1-8B --gpus 1xRTX4090-24
    --adapter lora|qlora|lora-int8``. Its winner's techniques and adapter settings, launched on the tiny
    model (the CPU's shape, and the standard loss where the winner's chunked one needs CUDA),
    train with the live objects of the plan."""
    from planner.engine.suggest import suggest
    from planner.schema.suggest import SuggestRequest

    winner = suggest(SuggestRequest(model="meta-llama/Llama-3.1-8B", gpus="1xRTX4090-24", adapter=[adapter])).plans[0]
    assert winner.config.adapter == adapter
    config = winner.config.model_dump() | SHAPE | {"loss": "standard"}
    plan = run(TINY, "1xRTX4090-24", **config)
    assert plan.feasible, plan.reasons
    port = 29900 + 7 * ["lora", "qlora", "lora-int8"].index(adapter)
    _launch_equals_plan(plan, tmp_path, tmp_path_factory, tiny_model, port, 1)


def _skip_where_deepspeed_refuses_fp16(plan, monkeypatch) -> None:
    """DeepSpeed refuses fp16 where its accelerator says the device has none ("Type fp16 is not
    supported on your device"). Without CUDA the launch runs DeepSpeed's CPU accelerator (chosen by
    its auto-detection; DS_ACCELERATOR=cpu names it here), whose answer is oneDNN's: torch's
    ``_is_mkldnn_fp16_supported``, true on x86 CPUs with AVX512-FP16 or AVX-NE-CONVERT."""
    import torch

    if (engine_of(plan.config.sharding) != Engine.DEEPSPEED or plan.config.precision != Precision.FP16_MIXED
            or torch.cuda.is_available()):
        return
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    from deepspeed.accelerator import get_accelerator

    if not get_accelerator().is_fp16_supported():
        pytest.skip("DeepSpeed's CPU accelerator has no fp16 here: this CPU lacks oneDNN's fp16 support "
                    "(AVX512-FP16 or AVX-NE-CONVERT on x86); the case runs on CPUs with it and on CUDA GPUs")


@FULL  # (CI: the formats, their labels and padded batches in-process, tests/test_launch_data.py)
def test_the_launch_trains_a_chat_dataset_with_the_models_template(tmp_path, tmp_path_factory, tiny_model):
    """TRL's conversational format (messages) and prompt-completion lines in one JSONL, rendered by
    the model's chat template, padded as planned: the run equals the plan."""
    import shutil

    import transformers

    model = tmp_path / "chat-model"
    shutil.copytree(tiny_model, model)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model)
    tokenizer.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
                               "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    tokenizer.save_pretrained(model)
    data = tmp_path / "chat.jsonl"
    lines = [json.dumps({"messages": [{"role": "user", "content": f"question {i} " * 6},
                                      {"role": "assistant", "content": f"answer {i} " * 9}]}) for i in range(12)]
    lines += [json.dumps({"prompt": f"say {i} " * 5, "completion": f" done {i} " * 7}) for i in range(4)]
    data.write_text("\n".join(lines) + "\n")
    plan = run(TINY, "1xA100-80", **(dict(precision="bf16-mixed", batching="padded") | SHAPE))
    _launch_equals_plan(plan, tmp_path, tmp_path_factory, model, 29960, 1, data=str(data))


def _launch_equals_plan(plan, tmp_path, tmp_path_factory, tiny_model, port: int, processes: int,
                        data: str = "sample") -> None:
    """Write ``plan``'s files, run its launch.sh (one per machine) for two steps on the tiny model,
    and hold every rank's live objects to the plan."""
    import torch

    out = tmp_path / "plan"
    write_files(build_files(single_plan_result(plan)), out, force=False)
    env = os.environ | {
        "MODEL": str(tiny_model), "DATA": data,
        "MAIN_PORT": str(port),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "OMP_NUM_THREADS": "1",
    }
    fsdp = plan.config.sharding.startswith("fsdp")  # (FSDP on one GPU runs distributed too: a world of one)
    if (processes > 1 or fsdp) and not plan.config.sharding.startswith("zero") and not torch.cuda.is_available():
        env["ACCELERATE_USE_CPU"] = "1"
    # ZeRO-Offload's CPU Adam is built on first use into torch's extension cache
    # (~/.cache/torch_extensions, rebuilt when its sources or flags change), as on a user's machine
    # one launch per machine, as a user runs it on each node (two "machines" here share this host)
    machines = [subprocess.Popen([str(out / "launch.sh"), "--max-steps", "2", "--no-save"], text=True, cwd=tmp_path,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 env=env | {"MACHINE_RANK": str(rank), "MAIN_ADDR": "127.0.0.1"})
                for rank in range(plan.hardware.nodes)]
    logs = [m.communicate(timeout=900)[0] for m in machines]
    log = "".join(logs)
    reports = sorted((out / "outputs").glob("planner-live-rank*.json"))
    assert len(reports) == processes, log[-4000:]
    for path in reports:
        report = json.loads(path.read_text())
        assert report["differences"] == [], (path.name, report["live"])
        assert report["plan"] == plan.config.model_dump(mode="json")
        if fsdp and plan.config.grad_accum > 1:  # the Trainer's no_sync or sync_each_batch, as planned
            assert report["live"]["gradient_sync"] == plan.config.gradient_sync, report["live"]
        if plan.config.adapter != "none":  # peft's trainable tensors are the ones the plan counts
            assert report["live"]["details"]["trainable_parameters"] == plan.model.num_trainable_parameters
        if plan.config.method in ("dpo", "grpo", "kto"):  # a reference model exactly where the plan holds one
            kept = any(r.label.startswith("the reference model") for r in plan.ledger)
            assert report["live"]["details"]["reference_model"] is kept, report["live"]
        if plan.config.method == "grpo":  # the plan's generation batch, in whole micro-batches of every GPU
            c = plan.config
            steps = report["live"]["details"]["steps_per_generation"]
            assert steps * c.micro_batch_size * processes == c.generation_batch_size > 0
        if plan.config.checkpointing == "selective":  # torchtitan's policy on a Llama layer: q, v, gate, down + SDPA
            saved = report["live"]["details"]["selective_saved_ops_per_layer_forward"]
            assert saved.get("mm.default") == 4 and sum(v for k, v in saved.items() if "attention" in k) == 1, saved
    assert all(m.returncode == 0 for m in machines), log[-4000:]
