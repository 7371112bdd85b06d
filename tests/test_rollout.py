"""GRPO's rollout terms (planner/cost/rollout.py) against the libraries themselves on the CPU:
transformers' KV cache after ``generate``, TRL's GRPOConfig and GRPOTrainer (the generation batch,
the reference model, the defaults planner reads), and the emitted GRPOConfig."""

import dataclasses
import inspect
import json
import warnings

import pytest

from planner.cost import rollout
from planner.strategies.method import GRPO_DEFAULTS

trl = pytest.importorskip("trl")
torch = pytest.importorskip("torch")


def test_transformers_kv_cache_is_the_bytes_per_token_times_the_tokens_cached(tiny):
    """After generating n tokens for r rows of p prompt tokens, the DynamicCache holds p + n - 1
    tokens per row (the last token is sampled, never fed back): kv_bytes_per_token each. The plan
    counts p + n (an upper bound by one token)."""
    import transformers

    from planner.catalog.models import resolve_model

    spec = resolve_model(str(tiny))
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    rows, prompt, new = 3, 10, 7
    ids = torch.randint(5, 4000, (rows, prompt))
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                         do_sample=True, return_dict_in_generate=True, pad_token_id=0)
    cache = out.past_key_values
    held = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert held == rows * (prompt + new - 1) * rollout.kv_bytes_per_token(spec, 4)
    assert rollout.transformers_kv_bytes(spec, rows, prompt + new, 4) - held == rows * rollout.kv_bytes_per_token(spec, 4)


def test_the_defaults_planner_reads_are_trls():
    defaults = {f.name: f.default for f in dataclasses.fields(trl.GRPOConfig)}
    assert {k: defaults[k] for k in GRPO_DEFAULTS} == GRPO_DEFAULTS
    assert defaults["vllm_gpu_memory_utilization"] == rollout.COLOCATE_SHARE_DEFAULT
    assert defaults["vllm_importance_sampling_correction"] is True  # the policy's scoring forward under vLLM
    from trl.scripts.vllm_serve import ScriptArguments

    serve = {f.name: f.default for f in dataclasses.fields(ScriptArguments)}
    assert serve["gpu_memory_utilization"] == rollout.SERVER_SHARE_DEFAULT
    from trl.generation import vllm_generation

    source = inspect.getsource(vllm_generation)
    assert f"max_num_batched_tokens={rollout.BATCHED_TOKENS}" in source and "self.llm.sleep(level=2)" in source


def _grpo_trainer(path, tmp_path, **kwargs):
    import datasets
    import transformers

    kwargs = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=1) | kwargs
    args = trl.GRPOConfig(output_dir=str(tmp_path / "out"), num_generations=4, max_completion_length=6, report_to=[],
                          use_cpu=True, bf16=False, save_strategy="no", dataloader_num_workers=0, logging_steps=1,
                          model_init_kwargs={"dtype": "float32"}, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
        data = datasets.Dataset.from_list([{"prompt": f"count to {i} and then stop"} for i in range(16)])
        return trl.GRPOTrainer(model=str(path), reward_funcs=lambda completions, **_: [float(len(c)) for c in completions],
                               args=args, train_dataset=data, processing_class=tokenizer)


def test_the_reference_model_only_with_beta_and_never_with_an_adapter(tiny, tmp_path):
    from peft import LoraConfig

    from planner.cost import params, preference

    assert _grpo_trainer(tiny, tmp_path).ref_model is None  # beta 0.0: TRL's default
    ref = _grpo_trainer(tiny, tmp_path, beta=0.04).ref_model
    policy_parameters = sum(p.numel() for p in ref.parameters())
    held = sum(p.numel() * p.element_size() for p in ref.parameters())
    assert held == preference.reference_weight_bytes(policy_parameters, 4, 1)
    from planner.catalog.models import resolve_model

    assert policy_parameters == params.total_parameters(resolve_model(str(tiny)))
    import datasets  # noqa: F401  (the trainer's)
    import transformers

    args = trl.GRPOConfig(output_dir=str(tmp_path / "o2"), per_device_train_batch_size=4, num_generations=4,
                          beta=0.04, use_cpu=True, bf16=False, report_to=[], model_init_kwargs={"dtype": "float32"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        adapter = trl.GRPOTrainer(model=str(tiny), reward_funcs=lambda completions, **_: [0.0] * len(completions),
                                  args=args, train_dataset=datasets.Dataset.from_list([{"prompt": "a"}] * 8),
                                  processing_class=transformers.AutoTokenizer.from_pretrained(tiny),
                                  peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert adapter.ref_model is None


def test_each_process_generates_the_micro_batch_times_the_accumulation_steps_at_once(tiny, tmp_path):
    """transformers' generation: one generate call per optimizer step over
    per_device_train_batch_size x gradient_accumulation_steps rows (TRL's default generation batch)."""
    trainer = _grpo_trainer(tiny, tmp_path)
    calls = []
    generate = trainer.model.generate

    def recorded(*a, **kw):
        calls.append(tuple((kw.get("input_ids") if "input_ids" in kw else a[0]).shape))
        return generate(*a, **kw)

    trainer.model.generate = recorded
    trainer.train()
    assert [rows for rows, _ in calls] == [4 * 2]


@pytest.mark.parametrize("mbs, accum, size, mu", [(4, 2, 16, 1), (4, 2, 0, 2), (2, 4, 4, 1)])
def test_generations_and_scoring_forwards_per_step_are_trls(tiny, tmp_path, mbs, accum, size, mu):
    """TRL's GRPOTrainer over two optimizer steps (transformers' generation), with a generation
    batch of two steps, two passes over each generation, and two generations per step: its generate
    calls (rows each) and its no-grad policy forwards (micro-batches of rows) are the plan's
    generation rows, generations per step and scoring forwards (``old_per_token_logps`` where the
    generation is not aligned with the optimizer steps)."""
    import torch

    from planner.catalog.gpus import parse_gpus
    from planner.catalog.models import resolve_model
    from planner.strategies import PlanContext, TrainingConfig
    from planner.strategies.generation import rows_per_generation
    from planner.strategies.method import generations_per_step, scoring_forwards

    extra = {"generation_batch_size": size} if size else {}
    trainer = _grpo_trainer(tiny, tmp_path, per_device_train_batch_size=mbs, gradient_accumulation_steps=accum,
                            num_iterations=mu, max_steps=2, **extra)
    generated, scored = [], []
    generate, logps = trainer.model.generate, trainer._get_per_token_logps_and_entropies

    def recorded_generate(*a, **kw):
        generated.append((kw.get("input_ids") if "input_ids" in kw else a[0]).shape[0])
        return generate(*a, **kw)

    def recorded_logps(model, input_ids, *a, **kw):
        if not torch.is_grad_enabled():
            scored.append(-(-input_ids.shape[0] // kw["batch_size"]))
        return logps(model, input_ids, *a, **kw)

    trainer.model.generate, trainer._get_per_token_logps_and_entropies = recorded_generate, recorded_logps
    trainer.train()
    config = TrainingConfig(method="grpo", generation="transformers", batching="padded", micro_batch_size=mbs,
                            grad_accum=accum, seq_len=64, completion_len=6, num_generations=4,
                            generation_batch_size=size, num_iterations=mu)
    ctx = PlanContext(resolve_model(str(tiny)), parse_gpus("1xA100-80"), config)
    assert generated == [rows_per_generation(ctx)] * round(2 * generations_per_step(ctx))
    assert sum(scored) == 2 * scoring_forwards(ctx) * accum / mu


def test_the_emitted_grpo_config_is_the_plan(tmp_path):
    """training_args.json of a GRPO plan, read by TRL's GRPOConfig: the group, the completion's
    length, beta, vLLM's mode, share and sleep, and one generation per optimizer step."""
    from transformers import HfArgumentParser

    from planner.emit import build_files, single_plan_result

    from helpers import run

    plan = run("Qwen/Qwen2.5-1.5B", "1xH100-80", method="grpo", generation="vllm-colocate-sleep", batching="padded",
               seq_len=1536, completion_len=1024, micro_batch_size=4, grad_accum=4, checkpointing="full",
               num_generations=8, kl_beta=0.04)
    assert plan.feasible
    values = json.loads(build_files(single_plan_result(plan))["training_args.json"])
    values |= {"bf16": False, "use_cpu": True, "output_dir": str(tmp_path)}  # (this machine has no bf16 GPU)
    (args,) = HfArgumentParser(trl.GRPOConfig).parse_dict(values)
    c = plan.config
    assert (args.num_generations, args.max_completion_length, args.beta) == (8, 1024, 0.04)
    assert (args.use_vllm, args.vllm_mode, args.vllm_enable_sleep_mode) == (True, "colocate", True)
    assert args.vllm_gpu_memory_utilization == c.vllm_share > 0
    assert args.steps_per_generation == c.grad_accum  # (TRL's default: one generation per step)
    assert args.generation_batch_size == c.generation_batch_size == c.micro_batch_size * c.grad_accum  # (one GPU)
    assert args.num_iterations == c.num_iterations == 1


def test_the_launch_cuts_grpo_prompts_to_the_plans_length_and_refuses_bad_lines(tiny, tmp_path):
    import transformers

    from planner.core.errors import PlannerInputError
    from planner.launch.data import grpo_prompts
    from planner.launch.rewards import completion_length, load

    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny)
    good = tmp_path / "prompts.jsonl"
    good.write_text('{"prompt": "' + "word " * 200 + '", "answer": "4"}\n\n{"prompt": "short"}\n')
    rows = grpo_prompts(str(good), tokenizer, 32, 1)
    assert [r.get("answer") for r in rows] == ["4", None]  # (the other fields reach the reward function)
    assert all(len(tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]) <= 32 for r in rows)
    assert rows[1]["prompt"] == "short"
    sample = grpo_prompts("sample", tokenizer, 32, 5)
    assert len(sample) == 5 and all(28 <= len(tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]) <= 32
                                    for r in sample)
    tokenizer.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
                               "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    good.write_text('{"prompt": [{"role": "user", "content": "short"}]}\n'
                    '{"prompt": [{"role": "user", "content": "' + "word " * 200 + '"}]}\n')
    with pytest.raises(PlannerInputError, match="line 2: the prompt's messages render to"):
        grpo_prompts(str(good), tokenizer, 32, 1)
    good.write_text('{"prompt": [{"role": "user", "content": "short"}]}\n')
    assert grpo_prompts(str(good), tokenizer, 32, 1) == [{"prompt": [{"role": "user", "content": "short"}]}]
    good.write_text('{"text": "no prompt"}\n')
    with pytest.raises(PlannerInputError, match="line 1 needs fields prompt"):
        grpo_prompts(str(good), tokenizer, 32, 1)
    with pytest.raises(PlannerInputError, match="a JSONL file of prompts"):
        grpo_prompts(str(tmp_path / "prompts.txt"), tokenizer, 32, 1)
    assert load("planner.launch.rewards:completion_length") is completion_length
    for spec, said in (("nocolon", "not module:function"), ("no_such_module_x:f", "cannot import")):
        with pytest.raises(PlannerInputError, match=said):
            load(spec)
