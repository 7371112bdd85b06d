"""One launch: the Trainer arguments as transformers reads them, the user's model with the plan's
runtime applied, the data batched as the plan says, and the Trainer that runs them (torch, transformers and
accelerate are imported here, when a launch runs)."""

import argparse
import importlib
import json
from pathlib import Path

from planner.catalog.files import read_mapping
from planner.check.job_files import beside
from planner.core.errors import PlannerInputError
from planner.core.lengths import Batching
from planner.launch import cpu
from planner.launch.data import (
    SAMPLE,
    Padded,
    WithPositions,
    grpo_prompts,
    packed_blocks,
    preference_pairs,
    read_texts,
    samples,
    unpaired_completions,
)
from planner.strategies import TrainingConfig
from planner.strategies.adapter import Adapter, quantization_config
from planner.strategies.method import Method
from planner.strategies.optimizer import CHOICES, RUNTIME_BUILT, TRAINER_READS
from planner.strategies.precision import Precision
from planner.strategies.sequence_parallel import pad_multiple
from planner.strategies.sharding import FSDP
from planner.strategies.tiled_mlp import TiledMlp


class Session:
    def __init__(self, args: argparse.Namespace, config: TrainingConfig):
        self.args, self.config = args, config
        self.notes: list[str] = []
        self.batch_shape: tuple[int, int] | None = None  # (sequences, tokens) of the first batch the model saw

    def training_arguments(self):
        """training_args.json through HfArgumentParser (unknown keys refused, as a Trainer script
        does), then the run's own settings from the flags: output folder, steps, learning rate, seed."""
        from transformers import HfArgumentParser, TrainingArguments

        cpu.before_training_arguments()
        path = self.args.job_dir / "training_args.json"
        values = read_mapping(path, "training arguments")
        for module in self.packages_called_on(values):
            importlib.import_module(module)
        if isinstance(values.get("deepspeed"), str):  # as planner check finds it: beside the file first
            values["deepspeed"] = str(beside(path, values["deepspeed"]))
        arguments = TrainingArguments
        if self.config.method == Method.DPO:  # a TRL DPOConfig (a TrainingArguments subclass)
            from trl import DPOConfig as arguments
        elif self.config.method == Method.GRPO:  # a TRL GRPOConfig
            from trl import GRPOConfig as arguments
        elif self.config.method == Method.KTO:  # a TRL KTOConfig
            from trl import KTOConfig as arguments
        if wrong := _mistyped(arguments, values):
            raise PlannerInputError([f"{path}: {w}" for w in wrong],
                                    hint="Fix the file, or write the plan's files again with planner emit.")
        try:
            (training,) = HfArgumentParser(arguments).parse_dict(values)
        except (ValueError, TypeError) as e:
            raise PlannerInputError(f"{path}: {arguments.__module__}.{arguments.__name__} refuses it: {e}") from None
        updates = {"output_dir": str(self.args.output_dir or self.args.job_dir / training.output_dir)}
        for flag, field in (("max_steps", "max_steps"), ("epochs", "num_train_epochs"),
                            ("learning_rate", "learning_rate"), ("seed", "seed")):
            if getattr(self.args, flag) is not None:
                updates[field] = getattr(self.args, flag)
        for field, value in updates.items():
            setattr(training, field, value)
        return training

    def packages_called_on(self, training_args: dict) -> list[str]:
        """The packages the plan's settings call on. The launch imports them before the tokenizer and
        model load: transformers and accelerate check for them with an ImportError that names no
        module (or, for DeepSpeed, a TypeError), and a missing one then exits 2, named (train.main)."""
        c, optim = self.config, training_args.get("optim")
        # the optimizer's: the implementation its Trainer optim name builds, or the runtime's
        choice = CHOICES[TRAINER_READS[optim]] if optim in TRAINER_READS else CHOICES[c.optimizer]
        impl = next((i for i in (choice.impl, choice.fsdp2) if i is not None and i.trainer_optim == optim),
                    choice.impl_for(c.sharding in FSDP and c.fsdp_version == 2))
        modules = [module for module, needed in (
            ("deepspeed", bool(training_args.get("deepspeed")) or c.tiled_mlp == TiledMlp.TILED),  # (ZeRO; TiledMLP)
            ("liger_kernel.transformers", training_args.get("use_liger_kernel") is True),
            ("bitsandbytes", quantization_config(c) is not None),
            ("torchao", c.precision == Precision.FP8_MIXED),
            ("peft", c.adapter != Adapter.NONE),
            ("trl", c.method != Method.SFT),
            ("vllm", training_args.get("use_vllm") is True),
            (impl.module.split(".")[0], bool(impl.library)),
        ) if needed]
        return list(dict.fromkeys(modules))

    def model(self):
        """The user's model, loaded locally with the plan's keyword arguments (load dtype, attention),
        then changed as runtime.json says (selective checkpointing)."""
        import transformers

        from planner import runtime

        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                self.args.model, local_files_only=True, **runtime.load_kwargs(self.config))
        except (OSError, ValueError) as e:
            raise PlannerInputError(f"--model {self.args.model}: cannot load it locally: {str(e)[:400]}",
                                    hint="Pass a model folder (config, weights) "
                                         "or an id in the local Hugging Face cache.") from None
        model.config.use_cache = False
        self.notes += runtime.prepare(model, self.config, runtime.Site.LAUNCH)
        model, notes = runtime.wrap(model, self.config, runtime.Site.LAUNCH)
        self.notes += notes
        model.register_forward_pre_hook(self._record_batch, with_kwargs=True)
        return model

    def _record_batch(self, module, args, kwargs):
        if self.config.method == Method.GRPO and not kwargs.get("fused_lm_head"):
            return  # generation's forwards: the batch is the first scored (or trained) micro-batch
        ids = kwargs.get("input_ids", args[0] if args else None)
        if self.batch_shape is None and ids is not None:
            self.batch_shape = tuple(ids.shape)

    def dataset(self, tokenizer, training):
        """The data as the plan batches it (``batching``, planner/core/lengths.py)."""
        texts = read_texts(self.args.data, self.args.text_field)
        per_step = training.per_device_train_batch_size * training.gradient_accumulation_steps * training.world_size
        need = per_step * max(training.max_steps, 1)
        build = packed_blocks if self.config.batching == Batching.PACKED else samples
        return build(texts, tokenizer, self.config.seq_len, at_least=need if self.args.data == SAMPLE else per_step,
                     repeat=self.args.data == SAMPLE)

    def collator(self, tokenizer):
        """Packed rows are all one length; padded ones are padded per micro-batch (``Padded``), to a
        multiple of tokens where the sequence is split over ranks."""
        from transformers import default_data_collator

        split = self.config.sequence_shards > 1  # (with the positions the ranks of a split sequence gather)
        if self.config.batching == Batching.PACKED:
            return WithPositions(default_data_collator) if split else default_data_collator
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        padded = Padded(pad if pad is not None else 0,
                        self.config.seq_len if self.config.batching == Batching.PADDED_MAX else None,
                        pad_multiple(lambda name: getattr(self.config, name, None)))
        return WithPositions(padded) if split else padded

    def trainer(self):
        import transformers

        training = self.training_arguments()
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(self.args.model, local_files_only=True)
        except (OSError, ValueError) as e:
            raise PlannerInputError(f"--model {self.args.model}: no tokenizer found locally: {str(e)[:300]}") from None
        model = self.model()
        if self.config.method in (Method.DPO, Method.KTO):  # TRL's trainer, its own collator and reference
            from trl import DPOTrainer, KTOTrainer

            per_step = training.per_device_train_batch_size * training.gradient_accumulation_steps * training.world_size
            at_least = per_step * max(training.max_steps, 1)
            if self.config.method == Method.DPO:
                rows, trainer = preference_pairs(self.args.data, self.config.seq_len, at_least), DPOTrainer
            else:
                rows, trainer = unpaired_completions(self.args.data, self.config.seq_len, at_least), KTOTrainer
            return _trainer_class(trainer)(session=self, model=model, args=training,
                                           train_dataset=_shared_dataset(rows, training, str(self.config.method)),
                                           processing_class=tokenizer)
        if self.config.method == Method.GRPO:  # TRL's trainer: prompts, the user's reward, its generation
            import datasets
            from trl import GRPOTrainer

            from planner.launch.rewards import completion_length, load

            if self.args.reward is None and self.args.data != SAMPLE:
                raise PlannerInputError("a GRPO plan needs a reward function: --reward module:function",
                                        hint="Name your reward function (TRL's signature: completions and the "
                                             "dataset's columns as keyword arguments), e.g. --reward my_rewards:accuracy.")
            reward = load(self.args.reward) if self.args.reward else completion_length
            prompts_per_step = training.generation_batch_size // self.config.num_generations
            prompts = grpo_prompts(self.args.data, tokenizer, self.config.seq_len - self.config.completion_len,
                                   prompts_per_step * max(training.max_steps, 1))
            return _trainer_class(GRPOTrainer)(session=self, model=model, reward_funcs=[reward], args=training,
                                               train_dataset=datasets.Dataset.from_list(prompts),
                                               processing_class=tokenizer)
        return _trainer_class()(
            session=self, model=model, args=training, train_dataset=self.dataset(tokenizer, training),
            data_collator=self.collator(tokenizer), processing_class=tokenizer)


def _mistyped(arguments: type, values: dict) -> list[str]:
    """The values of ``values`` that a numeric field of the arguments' dataclass (int or float, or
    Optional of one) cannot hold: HfArgumentParser.parse_dict passes a dict's values through
    unchecked, and the Trainer then fails deep in its loop ('>' not supported between str and int,
    None * int, a float overflow). Only numbers are checked: the library converts other fields'
    values itself (``fsdp: true`` for a field annotated str), and refusing what it takes would be
    stricter than the Trainer. A bool is an int, an int a float, as Python has them."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(arguments)
    wrong = []
    for f in dataclasses.fields(arguments):
        if f.name not in values:
            continue
        allowed = typing.get_args(hints[f.name]) or (hints[f.name],)
        kinds = [k for k in allowed if k is not type(None)]
        if not kinds or not all(k in (int, float) for k in kinds):
            continue
        value, named = values[f.name], " or ".join(k.__name__ for k in kinds)
        if value is None:
            if type(None) not in allowed:
                wrong.append(f"{f.name}: null, where a number ({named}) belongs")
        elif not isinstance(value, int | float) or (float not in kinds and isinstance(value, float)):
            wrong.append(f"{f.name}: {str(value)[:80]!r} is not a {named}")
        elif not abs(value) <= 2**53:
            wrong.append(f"{f.name}: {str(value)[:80]} is beyond what the Trainer computes with (2**53 at most)")
    return wrong


def _shared_dataset(rows: list[dict], training, name: str):
    """``rows`` as a ``datasets`` dataset from one file each machine's processes load: TRL caches
    precomputed reference log-probabilities beside the dataset's own cache files, which an
    in-memory dataset has per process only."""
    import datasets

    path = Path(training.output_dir) / f"planner-{name}-rows.jsonl"
    with training.main_process_first(local=True, desc=f"{name} rows"):
        if training.local_process_index == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return datasets.load_dataset("json", data_files=str(path), split="train")


def _trainer_class(base=None):
    """The Trainer (or ``base``, a Trainer subclass: TRL's DPOTrainer), building the plan's
    optimizer where the Trainer has no optim name for it (runtime.json), and with the CPU stand-ins
    of planner/launch/cpu.py on machines without CUDA."""
    from transformers import Trainer

    from planner.runtime.optimizer import build

    class PlanTrainer(base or Trainer):
        def __init__(self, *a, session: Session, **kw):
            self.session = session
            try:
                super().__init__(*a, **kw)
            except (ValueError, TypeError) as e:  # its checks of the arguments (report_to, ...) the file set
                raise PlannerInputError(f"{session.args.job_dir / 'training_args.json'}: the "
                                        f"{type(self).__mro__[1].__name__} refuses the plan's arguments: {e}",
                                        hint="Fix the file, or write the plan's files again with planner emit.") \
                    from None

        def create_accelerator_and_postprocess(self):
            super().create_accelerator_and_postprocess()
            cpu.after_accelerator(self)

        def _save(self, output_dir=None, state_dict=None):
            """Tensor subclasses (torchao's fp8 weight wrappers) have no storage safetensors can
            write: their high-precision inner tensor is what is saved."""
            if state_dict is None and self.session.config.precision == Precision.FP8_MIXED:
                state_dict = {k: _plain(v) for k, v in self.accelerator.unwrap_model(self.model).state_dict().items()}
            super()._save(output_dir, state_dict)

        def create_optimizer(self, model=None):
            config = self.session.config
            if config.optimizer not in RUNTIME_BUILT or self.optimizer is not None:
                return super().create_optimizer(model)
            target = self.model if model is None else model  # (the Trainer passes the FSDP-wrapped model)
            self.optimizer = build(str(config.optimizer), target, self.model.config, lr=self.args.learning_rate,
                                   fsdp2=config.sharding in FSDP and config.fsdp_version == 2)
            return self.optimizer

    return PlanTrainer


def _plain(tensor):
    """The plain tensor under a wrapper subclass (``__tensor_flatten__``'s first inner tensor)."""
    import torch

    while type(tensor) not in (torch.Tensor, torch.nn.Parameter) and hasattr(tensor, "__tensor_flatten__"):
        tensor = getattr(tensor, tensor.__tensor_flatten__()[0][0])
    return tensor
