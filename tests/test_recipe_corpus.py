"""The real job files of tests/data/recipes (issue 19's corpus): every file has a provenance row
(repository, path, a 40-hex commit, a kind) and every row a file, so the corpus stays traceable."""

import csv
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent / "data" / "recipes"
KINDS = {"accelerate", "deepspeed", "trl_recipe", "llamafactory", "axolotl", "torchtitan"}


def test_every_file_has_its_provenance_and_every_row_its_file():
    rows = list(csv.DictReader((ROOT / "provenance.csv").open()))
    files = {str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()} - {"provenance.csv", "PROVENANCE.md"}
    assert {r["local_path"] for r in rows} == files
    assert len(rows) >= 40
    for r in rows:
        assert re.fullmatch(r"[0-9a-f]{40}", r["commit"]), r
        assert r["kind"] in KINDS and r["repo"].count("/") == 1 and r["local_path"].endswith(r["path"]), r
        assert r["published_outcome"], r


def _rows(kind: str) -> list[dict]:
    return [r for r in csv.DictReader((ROOT / "provenance.csv").open()) if r["kind"] == kind]


#: The corpus's preference and RL recipes, named so by their own repositories' paths (the
#: handbook's dpo/ and orpo/ folders, open-r1's grpo/, LLaMA-Factory's *_dpo, *_kto, *_reward,
#: axolotl's instruct-dpo and orpo/): an oracle beside planner's own reading of their keys.
PREFERENCE_OR_RL = re.compile(r"(^|[/_-])(dpo|orpo|grpo|kto|reward)([/_.-]|$)")


def _preference_or_rl(path: Path) -> bool:
    return bool(PREFERENCE_OR_RL.search(str(path.relative_to(ROOT))))


def test_preference_and_rl_recipes_are_refused_or_planned_as_what_they_are(monkeypatch):
    """Every DPO, ORPO, KTO and reward-model file of the corpus (TRL recipes, LLaMA-Factory, axolotl)
    is refused with the method it names, never given an SFT verdict; no SFT file is; open-r1's GRPO
    recipes and axolotl's ``rl: grpo`` are planned as GRPO, axolotl's ``rl: kto`` as KTO, axolotl's ``rl: dpo`` (TRL's DPOTrainer) and LLaMA-Factory's
    ``stage: dpo`` as DPO."""
    from planner.check import CheckRequest, check
    from planner.check.methods import REFUSAL, REFUSAL_HINT
    from planner.core.errors import PlannerInputError

    rows = _rows("trl_recipe") + _rows("llamafactory") + _rows("axolotl")
    refused, grpo, dpo, kto = [], [], [], []
    for row in rows:
        path = ROOT / row["local_path"]
        monkeypatch.chdir(ROOT / row["local_path"].split("/")[0])
        try:
            result = check(CheckRequest(model="meta-llama/Llama-3.1-8B", gpus="8xH100-80", alternatives=0,
                                        training_args=path))
        except PlannerInputError as e:
            if any(REFUSAL in p for p in e.problems):
                assert e.hint == REFUSAL_HINT and _preference_or_rl(path), (row["local_path"], e.problems)
                refused.append(path.name)
                continue
            raise
        method = str(result.estimate.config.method)
        if "/grpo/" in row["local_path"] or "rl: grpo" in path.read_text():  # planned, as GRPO
            assert method == "grpo", row["local_path"]
            grpo.append(path.name)
            continue
        text = path.read_text()
        if (row["kind"], "rl: dpo" in text, "stage: dpo" in text) in (("axolotl", True, False),
                                                                      ("llamafactory", False, True)):
            assert method == "dpo", row["local_path"]  # axolotl: TRL's DPOTrainer; LLaMA-Factory's own
            dpo.append(path.name)
            continue
        if row["kind"] == "axolotl" and "rl: kto" in text:
            assert method == "kto", row["local_path"]  # TRL's KTOTrainer
            kto.append(path.name)
            continue
        assert not _preference_or_rl(path) and method == "sft", f"{row['local_path']} was planned as {method}"
    assert len(refused) == 8 and len(grpo) == 4, (refused, grpo)
    assert sorted(dpo) == ["instruct-dpo-lora-8b.yml", "qwen3_lora_dpo.yaml"], dpo
    assert kto == ["qlora-1b-kto.yaml"], kto


def test_every_trl_recipe_is_read_without_a_refusal():
    """Each TRL-style recipe (alignment-handbook, open-r1, TRL's CLI example) as the Trainer
    arguments of a check: no key refused (TrlParser's dataclasses: TRL configs, ModelConfig, the
    frameworks' script arguments; a refusal raises), and its workload read from the file."""
    import yaml

    from planner.check import CheckRequest, check

    rows = _rows("trl_recipe")
    assert len(rows) >= 18
    for row in rows:
        path = ROOT / row["local_path"]
        if _preference_or_rl(path):
            continue  # refused: test_preference_and_rl_recipes_are_refused_never_planned_as_sft
        result = check(CheckRequest(model="meta-llama/Llama-3.1-8B", gpus="8xH100-80", alternatives=0,
                                    training_args=path))
        for key, field in (("per_device_train_batch_size", "micro_batch_size"), ("gradient_accumulation_steps",
                                                                                 "grad_accum")):
            if key in yaml.safe_load(path.read_text()):
                assert result.sources[field].endswith(key), (row["local_path"], result.sources[field])


def test_a_handbook_qlora_recipe_is_read_as_its_qlora_plan():
    """alignment-handbook's zephyr-7b-beta QLoRA SFT recipe: TRL's use_peft, load_in_4bit, lora_r 16,
    lora_alpha 16 and every projection targeted read as qlora r16 all-linear."""
    from planner.check import CheckRequest, check

    path = ROOT / "huggingface__alignment-handbook/recipes/zephyr-7b-beta/sft/config_qlora.yaml"
    result = check(CheckRequest(model="mistralai/Mistral-7B-v0.1", gpus="1xA100-80", alternatives=0, training_args=path))
    c = result.estimate.config
    assert (c.adapter, c.lora_rank, c.lora_alpha, c.lora_dropout, c.lora_targets) == ("qlora", 16, 16, 0.05, "all-linear")
    assert (c.micro_batch_size, c.grad_accum, c.seq_len, c.checkpointing) == (4, 2, 2048, "full")


def test_parameter_only_offload_is_not_read_as_full_offload():
    """axolotl's zero3_bf16_cpuoffload_params.json (offload_param without offload_optimizer) on
    Llama-3.1-70B, 8xH100-80: DeepSpeed keeps the fp32 masters, Adam moments and gradients on the
    GPU (12 B per parameter / 8 ranks = 98.6 GiB of optimizer state alone), so the job will not fit
    (exit 1); it was read as optimizer+params offload and given FITS at 70.6 GiB."""
    from typer.testing import CliRunner

    from planner.cli import app
    from planner.core.ledger import Location

    path = ROOT / "axolotl-ai-cloud__axolotl/deepspeed_configs/zero3_bf16_cpuoffload_params.json"
    out = CliRunner().invoke(app, ["check", "--model", "meta-llama/Llama-3.1-70B", "--gpus", "8xH100-80",
                                   "--deepspeed-config", str(path), "--json"])
    assert out.exit_code == 1, out.output
    result = json.loads(out.output)
    assert result["estimate"]["config"]["offload"] == "params"
    from planner.check import CheckRequest, check

    est = check(CheckRequest(model="meta-llama/Llama-3.1-70B", gpus="8xH100-80", deepspeed_config=path,
                             alternatives=0)).estimate
    gpu = {t: sum(r.bytes for r in est.ledger if r.term == t and r.location == Location.GPU)
           for t in ("master_weights", "optimizer_states", "weights")}
    assert (gpu["master_weights"] + gpu["optimizer_states"]) / 2**30 == pytest.approx(70.55e9 * 12 / 8 / 2**30, rel=0.01)
    assert gpu["weights"] < 2**30  # the 16-bit partition is on the host (a few small persistent tensors stay)


def test_every_llamafactory_and_axolotl_file_is_read_as_its_framework(monkeypatch):
    """Each LLaMA-Factory and axolotl YAML of the corpus is read without a refusal (a model of its
    architecture named with --model where the catalog lacks the recipe's), and every value read
    from the file names the file's own key or the framework's default."""
    from planner.check import CheckRequest, check

    rows = _rows("llamafactory") + _rows("axolotl")
    assert len(rows) >= 24
    for row in rows:  # run from the repository's root, as the frameworks' CLIs are (relative DeepSpeed paths)
        path = ROOT / row["local_path"]
        if _preference_or_rl(path):
            continue  # refused: test_preference_and_rl_recipes_are_refused_never_planned_as_sft
        monkeypatch.chdir(ROOT / row["local_path"].split("/")[0])
        result = check(CheckRequest(model="meta-llama/Llama-3.1-8B", gpus="8xH100-80", alternatives=0,
                                    training_args=path))
        for field, where in result.sources.items():
            if where.startswith(path.name):
                key = where.split(": ", 1)[1].split()[0]
                assert key in ("no", "FSDP") or key in yaml.safe_load(path.read_text()), (row["local_path"], field, where)
        assert result.model_source.startswith("--model (the recipe names"), result.model_source


def test_llamafactory_defaults_and_refusals(tmp_path):
    """LLaMA-Factory's defaults as its sources state them (finetuning_type lora, lora_rank 8,
    alpha 2 x rank, dropout 0, gradient checkpointing on, cutoff_len 2048), QLoRA from
    quantization_bit 4; an unknown key is refused as llamafactory-cli refuses it, with "did you
    mean"; a key only older releases have warns."""
    from planner.check import CheckRequest, check
    from planner.core.errors import PlannerInputError

    f = tmp_path / "lf.yaml"
    f.write_text("model_name_or_path: Qwen/Qwen3-8B\nstage: sft\nquantization_bit: 4\nbf16: true\n")
    r = check(CheckRequest(gpus="1xA100-80", training_args=f, alternatives=0))
    c = r.estimate.config
    assert r.model_source == "lf.yaml: model_name_or_path" and r.estimate.model.id == "Qwen/Qwen3-8B"
    assert (c.adapter, c.lora_rank, c.lora_alpha, c.lora_dropout, c.lora_targets) == ("qlora", 8, 16, 0.0, "all-linear")
    assert (c.checkpointing, c.seq_len) == ("full", 2048)
    assert "LLaMA-Factory's default" in r.sources["checkpointing"] and "cutoff_len" in r.sources["seq_len"]
    f.write_text("model_name_or_path: Qwen/Qwen3-8B\nstage: sft\nlora_rnak: 16\n")
    with pytest.raises(PlannerInputError) as e:
        check(CheckRequest(gpus="1xA100-80", training_args=f, alternatives=0))
    assert "lora_rnak (did you mean lora_rank?)" in str(e.value) and "llamafactory-cli refuses" in str(e.value)
    f.write_text("model_name_or_path: Qwen/Qwen3-8B\nstage: sft\nlora_rank: eight\n")  # bad input, no crash
    with pytest.raises(PlannerInputError, match="lora_rank"):
        check(CheckRequest(gpus="1xA100-80", training_args=f, alternatives=0))


def test_axolotl_defaults_and_unknown_keys(tmp_path):
    """axolotl: bf16 auto loads bf16 weights and a full fine-tune on one GPU trains them (no fp32
    upcast: bf16-pure); sequence_len 512, micro_batch_size 1, adamw_torch_fused by default; an
    unknown key warns (axolotl drops it); qlora without load_in_4bit is refused as axolotl does;
    fsdp_config without a version is FSDP1."""
    from planner.check import CheckRequest, check
    from planner.core.errors import PlannerInputError

    f = tmp_path / "ax.yml"
    f.write_text("base_model: meta-llama/Llama-3.2-1B\nlearning_rate: 0.0001\nsequnce_len: 2048\n")
    r = check(CheckRequest(gpus="1xA100-80", training_args=f, alternatives=0))
    c = r.estimate.config
    assert (c.precision, c.seq_len, c.micro_batch_size, c.optimizer, c.checkpointing) == (
        "bf16-pure", 512, 1, "adamw", "none")
    assert any("sequnce_len (did you mean sequence_len?)" in w and "axolotl ignores" in w for w in r.warnings)
    f.write_text("base_model: meta-llama/Llama-3.2-1B\nadapter: qlora\nlora_r: 8\nlora_alpha: 16\n")
    with pytest.raises(PlannerInputError, match="load_in_4bit"):
        check(CheckRequest(gpus="1xA100-80", training_args=f, alternatives=0))
    f.write_text("base_model: meta-llama/Llama-3.2-1B\nfsdp: [full_shard, auto_wrap]\n"
                 "fsdp_config:\n  fsdp_offload_params: false\n  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer\n")
    r = check(CheckRequest(gpus="2xA100-80", training_args=f, alternatives=0))
    assert (r.estimate.config.sharding, r.estimate.config.fsdp_version) == ("fsdp", 1)
    assert r.estimate.config.precision == "bf16-mixed"  # accelerate's FSDP1 upcasts to fp32 under mixed precision


def test_a_recipe_loading_bf16_weights_trains_them_without_an_engine():
    """SmolLM2's SFT recipe (torch_dtype bfloat16, bf16) alone runs under DDP, which steps the bf16
    parameters (AdamW moments bf16 too): bf16-pure; under the handbook's ZeRO-3 config DeepSpeed
    keeps fp32 masters: bf16-mixed."""
    from planner.check import CheckRequest, check

    path = ROOT / "huggingface__alignment-handbook/recipes/smollm2/sft/config.yaml"
    alone = check(CheckRequest(gpus="8xH100-80", training_args=path, alternatives=0))
    zero3 = check(CheckRequest(gpus="8xH100-80", training_args=path, alternatives=0,
                               accelerate_config=ROOT / "huggingface__alignment-handbook/recipes/accelerate_configs/zero3.yaml"))
    assert alone.estimate.config.precision == "bf16-pure" and "torch_dtype" in alone.sources["precision"]
    assert (zero3.estimate.config.precision, zero3.estimate.config.sharding) == ("bf16-mixed", "zero3")


HB, OR, AX = "huggingface__alignment-handbook/recipes/", "huggingface__open-r1/recipes/", "axolotl-ai-cloud__axolotl/examples/"
#: axolotl's lora-8b.yml as first published with its README line "Single GPU @ 11GB VRAM"
AX_FIRST = "axolotl-ai-cloud__axolotl__15f7910d3/examples/"
#: Published outcomes (provenance.csv) checked as their authors launched them: recipe, the
#: accelerate config their README launches it with, a catalog model of the recipe's architecture
#: (the recipe's own where the catalog has it: zephyr-7b-sft-full is a Mistral-7B fine-tune,
#: zephyr-7b-gemma-sft a Gemma-7B one, SmolLM3-3B-checkpoints SmolLM3-3B's intermediate checkpoints,
#: Qwen2.5-Coder/Math-7B and -32B have Qwen2.5-7B's and -32B's shapes), GPUs (the stated ones; an
#: unstated 80 GB GPU as A100-80; axolotl's "any 24GB GPU" as an RTX 4090), extra flags, and the
#: published verdict.
VERDICTS = [
    (HB + "zephyr-7b-beta/sft/config_full.yaml", HB + "accelerate_configs/zero3.yaml", "mistralai/Mistral-7B-v0.1",
     "8xA100-80", {}, True),
    (HB + "zephyr-7b-beta/sft/config_qlora.yaml", None, "mistralai/Mistral-7B-v0.1", "1xA100-80", {}, True),
    # DPO recipes whose keys DPO shares with ORPO: the handbook runs them with run_dpo.py (--method dpo);
    # README: "full DPO needs 8 GPUs (80GB)", under ZeRO-3 (the reference partitioned like the policy)
    (HB + "zephyr-7b-beta/dpo/config_qlora.yaml", None, "mistralai/Mistral-7B-v0.1", "1xA100-80", {"method": "dpo"},
     True),
    (HB + "zephyr-7b-beta/dpo/config_full.yaml", HB + "accelerate_configs/zero3.yaml", "mistralai/Mistral-7B-v0.1",
     "8xA100-80", {"method": "dpo"}, True),
    (HB + "zephyr-7b-gemma/dpo/config_full.yaml", HB + "accelerate_configs/zero3.yaml", "google/gemma-7b",
     "8xA100-80", {"method": "dpo"}, True),
    (HB + "zephyr-7b-gemma/sft/config_full.yaml", HB + "accelerate_configs/zero3.yaml", "google/gemma-7b",
     "8xA100-80", {}, True),
    (HB + "smollm3/sft/sft.yaml", HB + "accelerate_configs/zero3.yaml", "HuggingFaceTB/SmolLM3-3B", "8xA100-80", {},
     True),
    # README: "You will require 8 GPUs (80GB of VRAM) to train the full model", launched with zero3.yaml
    (HB + "starchat2-15b/sft/config_v0.1.yaml", HB + "accelerate_configs/zero3.yaml", "bigcode/starcoder2-15b",
     "8xA100-80", {}, True),
    (HB + "smollm2/sft/config.yaml", None, "HuggingFaceTB/SmolLM2-1.7B", "8xH100-80", {}, True),
    (HB + "smollm2/dpo/config.yaml", None, "HuggingFaceTB/SmolLM2-1.7B", "8xH100-80", {"method": "dpo"}, True),
    (OR + "OpenR1-Distill-7B/sft/config_distill.yaml", OR + "accelerate_configs/zero3.yaml", "Qwen/Qwen2.5-7B",
     "8xH100-80", {}, True),
    (OR + "OlympicCoder-7B/sft/config_v00.00.yaml", OR + "accelerate_configs/zero3.yaml", "Qwen/Qwen2.5-7B",
     "8xH100-80", {}, True),
    (OR + "OlympicCoder-32B/sft/config_v00.00.yaml", OR + "accelerate_configs/fsdp.yaml", "Qwen/Qwen2.5-32B",
     "16x8xH100-80", {}, True),
    # the recipe's own comment: "we were unable to train at 32k due to OOM"
    (OR + "OlympicCoder-32B/sft/config_v00.00.yaml", OR + "accelerate_configs/fsdp.yaml", "Qwen/Qwen2.5-32B",
     "16x8xH100-80", {"seq_len": 32768}, False),
    # open-r1's README: "we use one GPU to run vLLM for faster generation and the remaining GPUs for
    # training ... on 8 GPUs, zero2.yaml ... --num_processes=7" (TRL 0.14-0.16's vllm_device; a
    # vLLM server on one GPU in today's TRL: the flags say so)
    (OR + "Qwen2.5-1.5B-Instruct/grpo/config_demo.yaml", OR + "accelerate_configs/zero2.yaml", "Qwen/Qwen2.5-1.5B",
     "7xH100-80", {"generation": "vllm-server", "vllm_gpus": 1}, True),
    (OR + "DeepSeek-R1-Distill-Qwen-1.5B/grpo/config_demo.yaml", OR + "accelerate_configs/zero2.yaml",
     "Qwen/Qwen2.5-1.5B", "7xH100-80", {"generation": "vllm-server", "vllm_gpus": 1}, True),
    (AX + "llama-2/qlora.yml", None, "meta-llama/Llama-2-7b-hf", "1xRTX4090-24", {}, True),
    (AX + "llama-2/lora.yml", None, "meta-llama/Llama-2-7b-hf", "1xRTX4090-24", {}, True),
    # LoRA over an LLM.int8() base (load_in_8bit): "Single GPU @ 11GB VRAM", on any 24 GB GPU
    (AX_FIRST + "llama-3/lora-8b.yml", None, "meta-llama/Llama-2-7b-hf", "1xRTX4090-24", {}, True),
    # "dual GPU @ 21GB": FSDP1 CPU offload of the NF4 base; the README states no host RAM, and
    # planner's model load (rank 0 holds the 16-bit checkpoint, 141 GB: an upper bound) needs
    # more than its default 2x GPU memory, so the machine is stated as a 256 GB workstation
    (AX + "llama-3/qlora-fsdp-70b.yaml", None, "meta-llama/Llama-3.1-70B", "2xRTX4090-24", {"host_memory_gb": 256},
     True),
]


@pytest.mark.parametrize("recipe, accelerate, model, gpus, flags, published", VERDICTS,
                         ids=[f"{v[0].rsplit('/', 3)[-3]}-{v[0].rsplit('/', 1)[-1]}{''.join(f'-{k}={x}' for k, x in v[4].items())}"
                              for v in VERDICTS])
def test_verdicts_agree_with_published_outcomes(recipe, accelerate, model, gpus, flags, published):
    from planner.check import CheckRequest, check

    result = check(CheckRequest(model=model, gpus=gpus, training_args=ROOT / recipe, alternatives=0,
                                accelerate_config=ROOT / accelerate if accelerate else None, **flags))
    assert result.fits == published, (recipe, result.reasons, result.estimate.memory["peak"] / 2**30)


def test_published_memory_figures_and_the_disagreements_stated():
    """axolotl's README memory figures (examples/llama-3/README.md), and where planner's figure
    differs, why (the closing note's table states them too):
    - fft-8b (full fine-tune, bf16 weights, paged AdamW 8-bit, 8,192 tokens): "Single GPU @ 48GB
      VRAM". The paged state (16 GB) spills to the host on such a GPU; the rest, planner's peak,
      is 54.1 GB (+13 %), reached at the start of the loss's backward, which holds three fp32
      copies of the 8,192 x 128,256 logits (12.6 GB; traced against transformers 5). Of it, 5.7
      GB is the caching allocator's reserve: 12 % of the allocated peak, as an H100 measured it
      with full checkpointing (Llama-3.2-1B at 2 x 2048; benchmarks/results/H100-SXM-80/2026-11-26; 3.5-5.4 %
      without). Whether this shape keeps that much is not measured: the disagreement is open,
      and planner does not promise the job on a 48 GB card (an RTX A6000 is 3.9 GiB short).
    - lora-8b as first published (15f7910d3: Llama-2-7B, LoRA r32 over an LLM.int8() base,
      2 x 4,096 tokens): "Single GPU @ 11GB VRAM". Planner: 15.3 GB, and fits any 24 GB GPU. 11 GB
      is below what the job holds by construction: the weights (int8 linears, 16-bit embeddings and
      head: 7.3 GB), the 32 checkpointed layer inputs of 8,192 tokens (2.1 GB) and the CUDA
      context (1 GiB) already take 10.5 GB, before the loss's fp32 logits (8,192 x 32,000) or a
      layer's recompute.
    - lora-8b today (Llama-3-8B, lora_modules_to_save embed_tokens and lm_head): the README line
      predates both changes. planner warns that the two modules trained in full are not counted
      (a lower bound), and even so needs 25.6 GiB on one GPU with the standard loss (the 128k
      vocabulary's fp32 logits: 12.6 GB): it will not fit 24 GB, and fits once the loss is
      chunked.
    - qlora-fsdp-70b ("dual GPU @ 21GB"): fits, at a lower peak than the published figure (see
      the PEFT case below), and in the default host RAM (2 x 48 GB): the 4-bit load holds one
      16-bit shard per rank and rank 0's 4-bit copy, not the 16-bit model."""
    from planner.check import CheckRequest, check

    fft = dict(model="meta-llama/Llama-3.1-8B", alternatives=0, training_args=ROOT / AX / "llama-3/fft-8b.yaml")
    a40 = check(CheckRequest(gpus="1xA40-48", **fft)).estimate  # (its paged state spills to the host)
    assert a40.config.precision == "bf16-pure" and a40.paged.spilled_bytes == a40.paged.state_bytes
    assert 48 < a40.peak_without_paged / 1e9 < 48 * 1.15  # above the published class (see above)
    reserve = sum(r.bytes for r in a40.ledger if r.term == "allocator_reserve")
    assert reserve / (a40.peak_without_paged - reserve - 1.25 * 2**30) == pytest.approx(0.12, abs=0.005)
    a6000 = check(CheckRequest(gpus="1xRTXA6000-48", **fft))
    assert not a6000.fits and a6000.estimate.memory["peak"] > 47.99 * 2**30
    fsdp = check(CheckRequest(model="meta-llama/Llama-3.1-70B", gpus="2xRTX4090-24", alternatives=0,
                              training_args=ROOT / AX / "llama-3/qlora-fsdp-70b.yaml"))
    assert (fsdp.estimate.config.offload, fsdp.estimate.config.fsdp_version) == ("optimizer+params", 1)
    assert fsdp.estimate.memory["peak"] < 21e9 and fsdp.fits  # GPU and the default host RAM
    assert any(r.startswith("host RAM fits") for r in fsdp.reasons)
    first = check(CheckRequest(model="meta-llama/Llama-2-7b-hf", gpus="1xRTX4090-24", alternatives=0,
                               training_args=ROOT / AX_FIRST / "llama-3/lora-8b.yml")).estimate
    rows = {r.label: r.bytes for r in first.ledger}
    assert first.config.adapter == "lora-int8" and rows["frozen decoder linears (int8, fp32 scale per row)"] > 6.4e9
    assert 11e9 < first.memory["peak"] < 24e9
    lora = check(CheckRequest(model="meta-llama/Meta-Llama-3-8B", gpus="1xRTX4090-24", alternatives=3,
                              training_args=ROOT / AX / "llama-3/lora-8b.yml"))
    assert lora.estimate.config.adapter == "lora-int8" and not lora.fits
    assert any("lora_modules_to_save" in w and "lower bound" in w for w in lora.warnings)
    assert any("chunked" in ch.change and ch.fits for ch in lora.changes)


def test_fsdp_qlora_70b_against_peft_published_figures():
    """PEFT's FSDP-QLoRA guide (huggingface/peft docs/source/accelerate/fsdp.md, v0.21.2, "Memory
    usage"): Llama-2-70B on 2 GPUs, accelerate FSDP1 (fsdp_config_qlora.yaml: FULL_SHARD,
    offload_params) and --bf16, seq 2048 packed, batch 2 x accum 2, gradient checkpointing, flash
    attention, LoRA r 8 / alpha 16 / dropout 0.1 on all linears, nested NF4 in bf16 storage:
    "the memory consumed per GPU is 19.6 GB while CPU RAM usage is around 107 GB. When disabling
    CPU offloading, the GPU memory usage is 35.6 GB/GPU".
    Without offload planner agrees within 10 %. With offload it is lower than the published
    figure (14 GB vs 19.6: the guide's caveat says offload's GPU saving is untested, and what
    FSDP1's CPU offload keeps on the GPU beyond the gathered units is not modelled): stated, and
    the 2 x 24 GB verdict the guide draws from it holds. Host RAM (planner/cost/adapters.py
    ``quantized_load_host_bytes``: a 16-bit shard per rank, rank 0's 4-bit copy beside FSDP's
    offloaded flat parameters): ~80 GB against the guide's ~107 GB, within -30 % .. +10 % (the
    rest is not modelled: issue 36); it read 144 GB (+35 %) with the 16-bit model in host RAM."""
    from planner.engine.estimate import estimate
    from planner.schema.estimate import EstimateRequest

    job = dict(model="meta-llama/Llama-2-70b-hf", adapter="qlora", sharding="fsdp", fsdp_version=1,
               checkpointing="full", seq_len=2048, micro_batch_size=2, grad_accum=2, lora_rank=8, lora_alpha=16,
               lora_dropout=0.1, precision="bf16-mixed")
    plain = estimate(EstimateRequest(gpus="2xA100-80", offload="none", **job))
    assert plain.memory["peak"] / 1e9 == pytest.approx(35.6, rel=0.1)
    offload = estimate(EstimateRequest(gpus="2xRTX4090-24", offload="optimizer+params", host_memory_gb=256, **job))
    assert offload.fits and offload.memory["peak"] / 1e9 < 19.6
    assert -0.30 <= offload.host_memory["peak"] / 107e9 - 1 <= 0.10, offload.host_memory["peak"] / 1e9
    # the CPU steps the adapters only (104M parameters), not the 69B frozen base
    assert offload.time.terms["cpu_optimizer_step"] < 1.0


def test_axolotl_dpo_is_planned_as_trl_runs_it():
    """axolotl's instruct-dpo-lora-8b (rl: dpo, LoRA over an LLM.int8() base): TRL's DPOTrainer with
    the adapter-disabled base as its reference, so no reference copy; pairs of sequence_len rows;
    each value named by the axolotl key it came from."""
    from planner.check import CheckRequest, check

    path = ROOT / "axolotl-ai-cloud__axolotl/examples/llama-3/instruct-dpo-lora-8b.yml"
    result = check(CheckRequest(model="meta-llama/Llama-3.1-8B", gpus="1xA100-80", training_args=path,
                                alternatives=0))
    cfg = result.estimate.config
    assert (str(cfg.method), str(cfg.adapter), cfg.seq_len, cfg.micro_batch_size) == ("dpo", "lora-int8", 4096, 2)
    assert cfg.rows_per_micro_batch == 4
    assert not any(r.label.startswith("the reference model") for r in result.estimate.ledger)
    assert any(r.label.startswith("reference forward") for r in result.estimate.ledger)
    assert result.sources["method"] == "instruct-dpo-lora-8b.yml: rl dpo (TRL's DPOTrainer)"


def test_axolotl_grpo_is_planned_as_trl_runs_it(tmp_path):
    """axolotl's GRPO cookbook recipe (rl: grpo; its trl: block): TRL's GRPOTrainer with a vLLM
    server (axolotl's default vLLM mode), 16 completions of 512 tokens per prompt in rows of
    sequence_len, beta 0.001 (a reference copy), each value named by the axolotl key it came from;
    colocated, the share is the vllm: block's; what leaves TRL's GRPOTrainer is refused, and a
    completion of unbounded length is a problem."""
    from planner.check import CheckRequest, check
    from planner.check.methods import REFUSAL
    from planner.core.errors import PlannerInputError

    path = ROOT / "axolotl-ai-cloud__grpo_code/r1_acecode.yaml"
    result = check(CheckRequest(model="Qwen/Qwen2.5-3B-Instruct", gpus="8xH100-80", training_args=path,
                                alternatives=0))
    cfg = result.estimate.config
    assert (str(cfg.method), str(cfg.generation), cfg.num_generations, cfg.completion_len, cfg.kl_beta) == (
        "grpo", "vllm-server", 16, 512, 0.001)
    assert (cfg.seq_len, cfg.micro_batch_size, cfg.grad_accum, cfg.generation_batch_size) == (1024, 32, 2, 32 * 2 * 8)
    assert any(r.label.startswith("the reference model") for r in result.estimate.ledger)
    assert result.sources["num_generations"] == "r1_acecode.yaml: trl.num_generations"
    assert "axolotl's default with vLLM, server" in result.sources["generation"]
    assert any("neither axolotl nor TRL cuts a prompt to sequence_len" in w for w in result.warnings)
    base = "base_model: Qwen/Qwen2.5-1.5B\nrl: grpo\nsequence_len: 1536\nmicro_batch_size: 4\n"
    f = tmp_path / "ax.yml"
    f.write_text(base + "vllm:\n  gpu_memory_utilization: 0.35\n  tensor_parallel_size: 1\ntrl:\n  use_vllm: true\n"
                 "  vllm_mode: colocate\n  max_completion_length: 1024\n  num_iterations: 2\n")
    cfg = check(CheckRequest(gpus="2xH100-80", training_args=f, alternatives=0)).estimate.config
    assert (str(cfg.generation), cfg.vllm_share, cfg.vllm_tp, cfg.num_iterations, cfg.kl_beta) == (
        "vllm-colocate", 0.35, 1, 2, 0.0)
    for extra, words in (("  use_data_producer: true\n", "asynchronous GRPO"),
                         ("  use_liger_loss: true\n", "Liger's fused GRPO loss")):
        f.write_text(base + "trl:\n  max_completion_length: 512\n" + extra)
        with pytest.raises(PlannerInputError) as e:
            check(CheckRequest(gpus="2xH100-80", training_args=f, alternatives=0))
        assert any(words in p and REFUSAL in p for p in e.value.problems), e.value.problems
    f.write_text(base + "trl:\n  num_generations: 4\n")
    with pytest.raises(PlannerInputError, match="without trl.max_completion_length"):
        check(CheckRequest(gpus="2xH100-80", training_args=f, alternatives=0))


def test_axolotl_kto_is_planned_as_trl_runs_it():
    """axolotl's qlora-1b-kto (rl: kto): TRL's KTOTrainer over a QLoRA base, the adapter-disabled
    base as its reference (no copy), its KL estimate's forwards, rows of sequence_len."""
    from planner.check import CheckRequest, check

    path = ROOT / "axolotl-ai-cloud__axolotl/examples/llama-3/qlora-1b-kto.yaml"
    result = check(CheckRequest(gpus="1xA100-80", training_args=path, alternatives=0))
    cfg = result.estimate.config
    assert (str(cfg.method), str(cfg.kto_loss), str(cfg.adapter), cfg.seq_len, cfg.micro_batch_size) == (
        "kto", "kto", "qlora", 2048, 2)
    assert not any(r.label.startswith("the reference model") for r in result.estimate.ledger)
    assert any(r.label.startswith("reference forwards (the KL batch's") for r in result.estimate.ledger)
    assert result.sources["method"] == "qlora-1b-kto.yaml: rl kto (TRL's KTOTrainer)"


def test_llamafactory_dpo_is_planned_as_its_trainer_runs_it(tmp_path):
    """LLaMA-Factory's qwen3_lora_dpo (stage dpo, pref_loss sigmoid, LoRA): full-logits
    log-probabilities, the adapter-disabled base as reference (no copy), its forward beside the
    policy's fp32 logits; pref_loss orpo: no reference forward at all; a full fine-tune: a frozen
    copy in the compute dtype (LLaMA-Factory upcasts only trainable parameters); refused to emit."""
    import yaml

    from planner.check import CheckRequest, check
    from planner.core.errors import PlannerInputError
    from planner.emit.files import build_files, single_plan_result

    path = ROOT / "hiyouga__LLaMA-Factory/examples/train_lora/qwen3_lora_dpo.yaml"
    result = check(CheckRequest(model="Qwen/Qwen2.5-3B", gpus="1xA100-80", training_args=path, alternatives=0))
    cfg, labels = result.estimate.config, [r.label for r in result.estimate.ledger]
    assert (str(cfg.method), str(cfg.dpo_logprobs), str(cfg.dpo_reference)) == ("dpo", "full-logits", "model")
    assert "the policy's fp32 logits and log-softmax output, alive beside it" in labels
    assert not any(x.startswith("the reference model") for x in labels)
    assert result.sources["dpo_logprobs"].startswith("qwen3_lora_dpo.yaml: stage dpo")

    def variant(**changes):
        f = tmp_path / f"{'_'.join(map(str, changes.values()))}.yaml"
        f.write_text(yaml.safe_dump(yaml.safe_load(path.read_text()) | changes))
        return check(CheckRequest(model="Qwen/Qwen2.5-3B", gpus="1xA100-80", training_args=f, alternatives=0))

    orpo = variant(pref_loss="orpo")
    assert str(orpo.estimate.config.dpo_reference) == "none"
    assert not any(r.label.startswith("reference forward") for r in orpo.estimate.ledger)
    assert orpo.estimate.memory["peak"] < result.estimate.memory["peak"]
    full = variant(finetuning_type="full")
    [copy] = [r for r in full.estimate.ledger if r.label.startswith("the reference model")]
    assert copy.bytes == full.estimate.model.num_parameters * 2  # bf16, whole on the one GPU
    with pytest.raises(PlannerInputError, match="checked, not emitted"):
        build_files(single_plan_result(result.estimate))
