"""The GPU validation's cases: what one short GPU window measures, in the order it is worth most.

Tier 1 settles the baseline, the seed article's verdicts (Llama-3.1-8B on an A100-40, emulated on
the bigger card: AdamW and 8-bit AdamW do not fit, paged 8-bit AdamW does, its state spilling to
host RAM) and each technique's rows on Llama-3.2-1B. Tier 2 covers the rest of the vocabulary, a
second family (Qwen2.5-0.5B: tied embeddings, long sequences) and the users' QLoRA case; tier 3
full depth at 8B and depth extrapolation against it.

Each case names the plan's GPUs as a ``--gpus`` spec in which ``{gpu}`` is this device's catalog
id (the native card) or another catalog GPU (emulated: the allocator capped at its memory), the
training configuration, what must work here first (``needs``: smoke tests of setup.py), and the
seconds it is expected to take on an H100 (start-up, build, 2 warm-up and 5 timed steps), which
the phase scheduler uses to skip a case that could not finish in time.

``--cpu`` runs the same cases on the tiny model (tests/data/tiny-llama) at 2 x 64 tokens: those
the CPU can run (``cpu``), so that the command is exercised in CI without a GPU.
"""

from dataclasses import dataclass, field, replace

L1B, L8B, Q05B = "meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-0.5B"
#: The seed article's card, emulated on the bigger one.
SEED_GPU = "A100-SXM-40"
#: The CPU mode's shape.
CPU_SHAPE = {"micro_batch_size": 2, "seq_len": 64}


@dataclass(frozen=True)
class Case:
    key: str
    tier: int
    model: str
    config: dict  # EstimateRequest fields beyond model and gpus
    gpus: str = "1x{gpu}"
    needs: tuple[str, ...] = ()  # smoke tests (setup.py SMOKE_TESTS) that must pass first
    expected_seconds: float = 12.0  # on an H100
    extrapolate_from: tuple[int, ...] = ()  # depths measured, extrapolated to full depth
    cpu: bool = True  # runs in --cpu mode (on the tiny model)
    what: str = ""
    cpu_depths: tuple[int, ...] = field(default=(), compare=False)  # the tiny model's depths to extrapolate from
    allocator_conf: str | None = None  # PYTORCH_CUDA_ALLOC_CONF where not the launch's ("": torch's default)
    measure_refused: bool = False  # measured though planner refuses the plan (to close the gap that refuses it)

    def gpus_on(self, device_gpu: str) -> str:
        return self.gpus.format(gpu=device_gpu)

    @property
    def emulated(self) -> bool:
        return "{gpu}" not in self.gpus


def _1b(key, what, needs=(), expected=8.0, cpu=True, tier=1, **config) -> Case:
    """A Llama-3.2-1B case at 2 x 2048 tokens."""
    shape = {"micro_batch_size": 2, "seq_len": 2048}
    return Case(key, tier, L1B, shape | config, needs=tuple(needs), expected_seconds=expected, cpu=cpu, what=what)


SEED = {"precision": "bf16-pure", "checkpointing": "full", "micro_batch_size": 1, "seq_len": 512}
EIGHT_B = {"optimizer": "adamw-8bit", "precision": "bf16-pure", "checkpointing": "full", "micro_batch_size": 1,
           "seq_len": 2048}

TIER1 = [
    _1b("1b-adamw", "baseline: fp32 master AdamW under bf16 autocast", expected=13.0, precision="bf16-mixed"),
    Case("seed-a100-40-adamw", 1, L8B, SEED | {"optimizer": "adamw"}, gpus=f"1x{SEED_GPU}", expected_seconds=60.0,
         cpu=False, what="seed: AdamW does not fit an A100-40"),
    Case("seed-a100-40-adamw-8bit", 1, L8B, SEED | {"optimizer": "adamw-8bit"}, gpus=f"1x{SEED_GPU}",
         needs=("bnb_8bit",), expected_seconds=60.0, cpu=False, what="seed: 8-bit AdamW does not fit either"),
    Case("seed-a100-40-paged-adamw-8bit", 1, L8B, SEED | {"optimizer": "paged-adamw-8bit"}, gpus=f"1x{SEED_GPU}",
         needs=("bnb_paged",), expected_seconds=70.0, cpu=False,
         what="seed: paged 8-bit AdamW fits, its state spilling (spill not measured here)"),
    _1b("1b-adamw-ckpt-full", "full checkpointing", expected=12.0, precision="bf16-mixed", checkpointing="full"),
    _1b("1b-bf16-pure", "bf16 weights, no master copy", expected=12.0, precision="bf16-pure"),
    _1b("1b-adamw-8bit", "bitsandbytes 8-bit states", ("bnb_8bit",), expected=16.0, optimizer="adamw-8bit",
        precision="bf16-mixed"),
    _1b("1b-adamw-4bit", "torchao 4-bit states (the Trainer's adamw_torch_4bit; its step compiles)", expected=40.0,
        cpu=False, optimizer="adamw-4bit", precision="bf16-mixed"),
    _1b("1b-paged-adamw-8bit", "paged 8-bit states (unified memory, no pressure)", ("bnb_paged",), expected=16.0,
        optimizer="paged-adamw-8bit", precision="bf16-mixed"),
    _1b("1b-lora", "LoRA r16 on all linears", ("peft",), expected=15.0, precision="bf16-mixed", adapter="lora"),
    _1b("1b-qlora", "QLoRA: NF4 base, LoRA r16", ("peft", "bnb_4bit"), expected=24.0, precision="bf16-mixed",
        adapter="qlora"),
    _1b("1b-fsdp2-w1", "FSDP2, a world of one", expected=14.0, precision="bf16-mixed", sharding="fsdp"),
    _1b("1b-zero2-w1", "DeepSpeed ZeRO-2, a world of one", ("deepspeed",), expected=38.0, precision="bf16-mixed",
        sharding="zero2"),
    _1b("1b-zero1-offload-w1", "ZeRO-Offload: DeepSpeed CPU-Adam steps on the host (the 8B 1xH100 winner's kind)",
        ("deepspeed",), expected=60.0, cpu=False, precision="bf16-mixed", sharding="zero1", offload="optimizer"),
    _1b("1b-fsdp2-offload-fused-w1", "FSDP2 CPU offload: torch's fused AdamW steps the host shard (the Trainer's)",
        expected=30.0, cpu=False, precision="bf16-mixed", sharding="fsdp", offload="optimizer+params"),
]

TIER2 = [
    # the int8 base's matmuls keep their inputs out of the checkpoint's hooks (planner.cost.adapters
    # kept_input_bytes): every layer under the non-reentrant checkpoint, the recomputed one under the
    # reentrant (1.75 GiB apart at this shape)
    *(_1b(f"1b-lora-int8-ckpt-{impl}", f"LoRA over LLM.int8(), full checkpointing, {impl}", ("peft", "bnb_8bit"),
          expected=20.0, tier=2, precision="bf16-mixed", adapter="lora-int8", checkpointing="full", checkpoint_impl=impl)
      for impl in ("non-reentrant", "reentrant")),
    # peft's prepare_model_for_kbit_training as TRL <= 0.25 runs it (fp32 norms: an fp32 residual
    # stream and fp32 MLP intermediates; planner.cost.adapters adapter_layer_saved ``prepared``),
    # checkpointed and not, against 1b-qlora's unprepared base
    *(_1b(f"1b-qlora-kbit-prep-ckpt-{ckpt}", f"QLoRA over a base prepared for k-bit training (fp32 norms), "
          f"checkpointing {ckpt}", ("peft", "bnb_4bit"), expected=24.0, tier=2, precision="bf16-mixed", adapter="qlora",
          kbit_prep="fp32-norms", checkpointing=ckpt) for ckpt in ("none", "full")),
    _1b("1b-fp8", "fp8 linears (torchao; eager here, the launch compiles)", ("torchao_fp8",), 14.0, False, 2,
        precision="fp8-mixed"),
    _1b("1b-chunked-loss", "Liger fused linear cross-entropy", ("liger",), expected=18.0, tier=2, precision="bf16-mixed",
        loss="chunked"),
    Case("8b-qlora", 2, L8B, {"micro_batch_size": 2, "seq_len": 2048, "precision": "bf16-mixed",
                              "checkpointing": "full", "adapter": "qlora"},
         needs=("peft", "bnb_4bit"), expected_seconds=72.0, cpu=False, what="the users' QLoRA case"),
    _1b("1b-paged-adamw", "paged 32-bit AdamW", ("bnb_paged",), expected=17.0, tier=2, optimizer="paged-adamw",
        precision="bf16-mixed"),
    _1b("1b-zero3-w1", "DeepSpeed ZeRO-3, a world of one", ("deepspeed",), expected=37.0, tier=2,
        precision="bf16-mixed", sharding="zero3"),
    Case("1b-fsdp2-rank-of-8", 2, L1B, {"micro_batch_size": 2, "seq_len": 2048, "precision": "bf16-mixed",
                                        "sharding": "fsdp"}, gpus="8x{gpu}", expected_seconds=14.0,
         what="FSDP2 as one rank of 8"),
    _1b("1b-ckpt-selective", "selective checkpointing", expected=12.0, tier=2, precision="bf16-mixed",
        checkpointing="selective"),
    _1b("1b-zero3-offload-w1", "ZeRO-3 + offload optimizer: no stream pool modelled, hooks at ZeRO-3's rate",
        ("deepspeed",), expected=60.0, cpu=False, tier=2, precision="bf16-mixed", sharding="zero3",
        offload="optimizer"),
    Case("1b-zero3-offload-params-fp16-w1", 2, L1B, {"micro_batch_size": 1, "seq_len": 1024, "grad_accum": 2,
                                                    "precision": "fp16-mixed", "sharding": "zero3",
                                                    "offload": "optimizer+params", "checkpointing": "full"},
         needs=("deepspeed",), expected_seconds=70.0, cpu=False, measure_refused=True,
         what="ZeRO-3 offloading parameters too, fp16, 1 x 1024: the shape of the world corpus's 8B ZeRO-3 "
              "offload report (13 GB seen against 5.0 planned; benchmarks/world/peaks.yaml); refused since "
              "run 13 measured it 1.7x over the plan (strategies/offload.py), measured to find why"),
    # LoRA's step: measured 0.118-0.139 s against 0.068 planned (runs 1-11), and no faster than full
    # fine-tuning (0.123 s); these two split the gap into dropout's copies and per-module overhead
    _1b("1b-lora-nodropout", "LoRA r16 on all linears without dropout: what lora_dropout's copies cost",
        ("peft",), expected=15.0, tier=2, precision="bf16-mixed", adapter="lora", lora_dropout=0.0),
    _1b("1b-lora-attention", "LoRA r16 on the attention projections: the overhead per wrapped module",
        ("peft",), expected=15.0, tier=2, precision="bf16-mixed", adapter="lora", lora_targets="attention"),
    _1b("1b-zero1-w1", "DeepSpeed ZeRO-1, a world of one: its hooks, given ZeRO-2's figure", ("deepspeed",),
        expected=38.0, cpu=False, tier=2, precision="bf16-mixed", sharding="zero1"),
    *(Case(f"1b-fsdp2-rank-of-8-accum2{suffix}", 2, L1B, {"micro_batch_size": 2, "seq_len": 2048, "grad_accum": 2,
                                                         "precision": "bf16-mixed", "sharding": "fsdp",
                                                         "gradient_sync": sync}, gpus="8x{gpu}",
           expected_seconds=16.0, cpu=False, what=f"FSDP2 as one rank of 8 with accumulation, {what}")
      for suffix, sync, what in (("", "step", "reducing once per step: the unsharded gradients it accumulates"),
                                 ("-sync", "micro-batch", "reducing every micro-batch: its sharded gradients"))),
    *(Case(f"qwen-0.5b-{ckpt}-{mbs}x{seq}", 2, Q05B, {"micro_batch_size": mbs, "seq_len": seq,
                                                      "precision": "bf16-mixed", "checkpointing": ckpt},
           expected_seconds=11.0, what="second family: tied embeddings, long sequences")
      for mbs, seq in ((4, 1024), (2, 4096)) for ckpt in ("none", "full")),
    # DeepSpeed's TiledMLP (planner/runtime/tiled_mlp.py): 19 tiles of 16,384 positions, the MLP
    # norm's backward as the layer's peak (bf16-pure: under autocast the plan is refused)
    Case("qwen-0.5b-tiled-mlp-full-1x16384", 2, Q05B, {"micro_batch_size": 1, "seq_len": 16384,
                                                      "precision": "bf16-pure", "checkpointing": "full",
                                                      "tiled_mlp": "tiled"},
         needs=("deepspeed",), expected_seconds=20.0, what="the tiled MLP at a long sequence"),
    # the selective policy's host floor was solved on 1b-ckpt-selective alone (6.0 ms a layer a
    # pass): another depth and width, out of sample
    Case("qwen-0.5b-selective-4x1024", 2, Q05B, {"micro_batch_size": 4, "seq_len": 1024, "precision": "bf16-mixed",
                                                "checkpointing": "selective"},
         expected_seconds=12.0, what="the selective policy's host floor on 24 narrow layers, out of sample"),
]

#: Two plans again under torch's default allocator (no expandable segments): what a job launched
#: without planner's launch.sh reserves beyond its allocated peak, against the plan's.
TIER2 += [replace(c, key=f"{c.key}-torch-alloc", tier=2, allocator_conf="",
                  what="torch's default allocator: the reserve of a job without planner's launch")
          for c in TIER1 + TIER2 if c.key in ("1b-adamw", "qwen-0.5b-full-4x1024")]

TIER3 = [
    Case("8b-8bit-pure-full", 3, L8B, EIGHT_B, needs=("bnb_8bit",), expected_seconds=70.0, cpu=False,
         what="full depth at 8B"),
    Case("8b-8bit-pure-full-extrapolated", 3, L8B, EIGHT_B, needs=("bnb_8bit",), expected_seconds=60.0,
         extrapolate_from=(2, 4, 8), cpu_depths=(1, 2), what="the 8B case from 2/4/8 layers"),
    # Liger's per-chunk head-gradient traffic, from its code, checked at 1B only: at 8B (h 4,096,
    # bf16 gradient, 32 chunks of 64 tokens) against the same case with the standard loss
    Case("8b-8bit-pure-full-chunked", 3, L8B, EIGHT_B | {"loss": "chunked"}, needs=("bnb_8bit", "liger"),
         expected_seconds=70.0, cpu=False, what="the chunked loss's head-gradient traffic at 8B"),
]

CASES = TIER1 + TIER2 + TIER3
