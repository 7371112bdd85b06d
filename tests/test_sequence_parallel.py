"""Ulysses sequence parallelism (strategies/sequence_parallel.py, planner/cost/sequence.py): the
rules DeepSpeed's UlyssesSPAttentionHF enforces, a rank's share of the tokens, the rows that follow
from it, and the files accelerate's own launcher and ParallelismConfig read back."""

import pytest

from planner.catalog.gpus import parse_gpus
from planner.catalog.models import resolve_model
from planner.cost import comms, compute, overheads, sequence
from planner.engine.estimate import check_config, estimate_config
from planner.engine.ranking import TIE_BAND
from planner.strategies import PlanContext, TrainingConfig, rates
from planner.strategies.sequence_parallel import exchange_seconds
from planner.strategies.sharding import ZERO

LLAMA8 = "meta-llama/Llama-3.1-8B"


def _config(seq_len: int, sp: int | None, **over) -> TrainingConfig:
    values = {"sharding": "zero3", "checkpointing": "full", "seq_len": seq_len} | over
    if sp:
        values |= {"sequence_parallel": "ulysses", "sp_size": sp}
    return TrainingConfig(**values)


def _ctx(seq_len: int, sp: int | None, gpus: str = "8xH100-80", model: str = LLAMA8, **over) -> PlanContext:
    return PlanContext(resolve_model(model), parse_gpus(gpus), _config(seq_len, sp, **over))


@pytest.mark.parametrize("model, p, refused", [
    (LLAMA8, 8, None),  # 32 heads, 8 key/value heads
    (LLAMA8, 16, None),  # key/value heads repeated to one a rank
    (LLAMA8, 3, "32 attention heads are not divisible by --sp-size 3"),
    ("Qwen/Qwen2.5-7B", 4, None),  # 28 heads, 4 key/value heads
    ("Qwen/Qwen2.5-7B", 8, "28 attention heads are not divisible by --sp-size 8"),
])
def test_the_head_rules_are_ulysses_own(model, p, refused):
    """UlyssesSPAttentionHF.__init__ (DeepSpeed 0.19): heads divisible by p; key/value heads and p,
    one dividing the other."""
    assert sequence.ulysses_refusal(resolve_model(model), p) == refused


def test_key_value_heads_fewer_than_the_degree_are_repeated_to_one_a_rank():
    m = resolve_model(LLAMA8)
    assert sequence.kv_elements(m, 8) == 8 * 128
    assert sequence.kv_elements(m, 16) == 16 * 128  # kv_replication_factor 2
    assert sequence.exchanged_elements(m, 8) == (4096, 1024, 1024, 4096)


def test_a_rank_holds_its_share_of_each_sequence_and_a_step_counts_replicas():
    c = _config(32768, 8, micro_batch_size=1, grad_accum=4)
    assert c.sequence_shards == 8 and c.tokens_per_micro_batch == 4096
    assert c.kernel_tokens_per_micro_batch == c.real_tokens_per_micro_batch == 4096
    assert c.sequences_per_step(16) == 1 * 4 * 2  # two replicas of 8 GPUs
    assert _config(32768, None, micro_batch_size=1, grad_accum=4).sequences_per_step(16) == 64


def _rows(ctx: PlanContext, term: str) -> dict[str, int]:
    plan = estimate_config(ctx.model, ctx.hardware, ctx.config)
    return {r.label: r.bytes for r in plan.ledger if r.term == term}


def test_a_ranks_activations_and_loss_are_those_of_its_share_of_the_sequence():
    """Outside attention a rank computes seq/p positions of every sequence: its saved activations
    and its loss rows equal a plan of seq/p tokens without sequence parallelism, but for o_proj's
    input, a copy of its own (the output's all-to-all back), in the recomputed layer's saved set
    (full checkpointing: the top layer's backward); the all-to-alls' copies are the one row beyond
    them."""
    sp, plain = _ctx(65536, 8), _ctx(8192, None)
    regrouped = 2 * 4096 * 8192  # bf16 x heads x head_dim x a rank's tokens (8 key/value heads: none repeated)
    for term in ("activations", "logits"):
        with_sp, without = _rows(sp, term), _rows(plain, term)
        extra = {k: v for k, v in with_sp.items() if k not in without}
        differ = {k: with_sp[k] - v for k, v in without.items() if with_sp[k] != v}
        assert differ == ({"top layer's backward, start: activations and gradient temporaries": regrouped}
                          if term == "activations" else {})
        assert list(extra) == (["the top layer's forward: Ulysses' all-to-all copies of q, k and v"]
                               if term == "activations" else []), extra


def test_attention_flops_per_rank_are_the_whole_sequences_over_the_degree():
    """Each rank attends over every position for heads/p heads: p times the attention of a plan of
    seq/p tokens (whose rows are seq/p long), at the same tokens per rank."""
    sp, plain = _ctx(65536, 8), _ctx(8192, None)
    assert rates.tokens(sp) == rates.tokens(plain)
    assert rates.attention_forward_seconds(sp) == pytest.approx(8 * rates.attention_forward_seconds(plain), rel=1e-9)
    m = sp.model
    assert compute.attention_flops_per_token(m, 65536) == pytest.approx(8 * compute.attention_flops_per_token(m, 8192))


def test_the_all_to_alls_move_q_k_v_and_the_output_of_every_layer():
    """Per layer and pass: four all-to-alls, each rank sending (p-1)/p of its local tensors, over
    NVLink inside a node, each paying the link's latency."""
    ctx = _ctx(32768, 8)
    m, hw = ctx.model, ctx.hardware
    message = (4096 + 1024 + 1024 + 4096) * 2 * 4096  # elements per local token x bf16 x local tokens
    sent = comms.all_to_all_bytes(message, 8)
    assert sent == pytest.approx(7 / 8 * message)
    one = sent / (hw.gpu.gpu_link_bytes_per_s * overheads.LINK_EFFICIENCY) + 4 * overheads.COLLECTIVE_LATENCY_INTRA_S
    assert exchange_seconds(ctx) == pytest.approx(m.num_layers * one)
    assert exchange_seconds(_ctx(32768, None)) == 0.0


@pytest.mark.parametrize("over, code", [
    ({"sharding": "fsdp"}, "ulysses without zero"),
    ({"attention": "eager"}, "ulysses with eager attention"),
    ({"method": "dpo"}, "ulysses with this method"),
    ({"seq_len": 32769}, "seq len not a multiple of sp size"),
])
def test_what_accelerate_or_deepspeed_refuse_is_refused(over, code):
    ctx = PlanContext(resolve_model(LLAMA8), parse_gpus("8xH100-80"), _config(32768, 8).model_copy(update=over))
    assert code in check_config(ctx).codes


def test_a_degree_that_does_not_divide_the_gpus_is_refused():
    ctx = _ctx(32768, 16, gpus="12xH100-80")
    codes = check_config(ctx).codes
    assert "sp size does not divide the gpus" in codes


def test_the_emitted_block_is_what_accelerates_launcher_and_parallelism_config_read(monkeypatch):
    """accelerate's own launch parser reads the YAML block's keys as its arguments, its launcher
    turns them into the environment, and ParallelismConfig built from that environment has the
    plan's degree, backend, attention and data-parallel size (the one DeepSpeed's train_batch_size
    is computed over in accelerate's _prepare_deepspeed; the file leaves it "auto": the live launch
    in tests/test_launch_live.py fails at ZeRO-3 init otherwise)."""
    pytest.importorskip("accelerate")
    from accelerate.commands.launch import launch_command_parser
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils.launch import prepare_extend_env_parallelism_config

    from planner.emit.files import _draft

    ctx = _ctx(32768, 4, micro_batch_size=2, grad_accum=3)
    files = _draft(ctx)
    block = files.accelerate["parallelism_config"]
    args = launch_command_parser().parse_args(["train.py"])
    for key, value in block.items():
        assert hasattr(args, key), key
        setattr(args, key, value)
    env = prepare_extend_env_parallelism_config(args, {})
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    pc = ParallelismConfig()
    assert (pc.sp_size, pc.sp_backend, pc.sp_handler.sp_attn_implementation) == (4, "deepspeed", "sdpa")
    assert pc.total_size == 8 and pc.data_parallel_size == 2
    ds = files.deepspeed_config()
    # accelerate fills it at prepare: micro-batch x accumulation x processes / sp_size, the plan's step
    assert ds["train_batch_size"] == "auto"
    assert ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * pc.data_parallel_size \
        == ctx.config.sequences_per_step(8) == 12


def test_a_search_with_ulysses_divides_the_batch_over_the_replicas():
    from planner.engine.space import build_space

    space = build_space(8, 32768, {"sequence_parallel": ["ulysses"], "sharding": ["zero3"]}, settings={"sp_size": 8})
    assert space.data_parallel == 1 and space.global_batch_size == 4  # 4 x 32,768 = 131,072 tokens
    assert space.grad_accum(1) == 4
    with pytest.raises(Exception, match="name one value"):
        build_space(8, 32768, {"sequence_parallel": ["none", "ulysses"]}, settings={"sp_size": 8})


def _suggest(**over):
    from planner.engine.suggest import suggest
    from planner.schema.suggest import SuggestRequest

    return suggest(SuggestRequest(**({"model": LLAMA8, "gpus": "8xH100-80"} | over)))


def test_a_long_sequence_searches_every_degree_and_ranks_them_with_the_rest():
    """At 32,768 tokens the 8B's fastest plan on 8xH100-80 without sequence parallelism recomputes
    every layer; suggest searches Ulysses (with the ZeRO stages) and ring attention (with FSDP2)
    over 2, 4 and 8 GPUs beside it at the same global batch, and its winner is the best of the
    seven searches run one by one (ties to the simpler plan)."""
    merged = _suggest(seq_len=32768)
    gbs = merged.global_batch_size
    alone = {("none", 1): _suggest(seq_len=32768, sequence_parallel=["none"])}
    alone |= {("ulysses", p): _suggest(seq_len=32768, sequence_parallel=["ulysses"], sp_size=p, global_batch_size=gbs,
                                       sharding=list(ZERO)) for p in (2, 4, 8)}
    alone |= {("ring", p): _suggest(seq_len=32768, sequence_parallel=["ring"], sp_size=p, global_batch_size=gbs,
                                    sharding=["fsdp", "fsdp-grad-op"]) for p in (2, 4, 8)}
    assert all(r.global_batch_size == gbs for r in alone.values())
    assert alone["none", 1].plans[0].config.checkpointing == "full"
    assert all(r.plans for r in alone.values())
    winner = merged.plans[0]
    assert winner.config.sequence_shards > 1 and winner.config.checkpointing != "full"
    fastest = max(r.plans[0].time.tokens_per_second for r in alone.values())
    assert winner.time.tokens_per_second >= fastest * (1 - TIE_BAND)
    assert (winner.config, winner.time.tokens_per_second) in {
        (p.config, p.time.tokens_per_second) for r in alone.values() for p in r.plans}
    assert merged.considered == sum(r.considered for r in alone.values())
    line = [r for r in merged.reasons if r.startswith("sequence parallelism")]
    assert len(line) == 1 and "none 3" in line[0]
    assert all(f"{kind} x{p} " in line[0] for kind in ("ulysses", "ring") for p in (2, 4, 8))


def test_a_sequence_no_plan_fits_without_is_answered_with_ulysses():
    """131,072 tokens of the 8B fit no plan of 8xH100-80 without sequence parallelism that keeps its
    checkpointed inputs on the GPU and its MLPs whole; the search over degrees answers with one, and
    says that none fits without either, the offload and the tiled MLP aside."""
    assert not _suggest(seq_len=131072, sequence_parallel=["none"], checkpoint_offload=["none"], tiled_mlp=["none"]).plans
    result = _suggest(seq_len=131072, checkpoint_offload=["none"], tiled_mlp=["none"])
    assert result.plans and result.plans[0].config.sequence_shards > 1
    assert any("none: nothing fits" in r for r in result.reasons)


U, R = ["ulysses x2", "ulysses x4", "ulysses x8"], ["ring x2", "ring x4", "ring x8"]


@pytest.mark.parametrize("over, layouts", [
    ({"seq_len": 4096}, None),  # short: no degree unasked
    ({"seq_len": 4096, "sequence_parallel": ["ulysses"]}, U),  # named without a degree: every one
    ({"seq_len": 4096, "sequence_parallel": ["ring"]}, R),
    ({"seq_len": 4096, "sequence_parallel": ["ulysses", "ring"]}, U + R),
    ({"seq_len": 32768, "sequence_parallel": ["none", "ulysses"], "sp_size": 4}, ["none", "ulysses x4"]),
    ({"seq_len": 32768, "sequence_parallel": ["none", "ulysses", "ring"], "sp_size": 4},
     ["none", "ulysses x4", "ring x4"]),
    ({"seq_len": 32768, "sequence_parallel": ["ulysses"], "sp_size": 4}, None),
    ({"seq_len": 32768, "sharding": ["fsdp"]}, ["none"] + R),  # no ZeRO stage: ring only
    ({"seq_len": 32768, "sharding": ["zero3"]}, ["none"] + U),  # no FSDP: Ulysses only
    ({"seq_len": 32768, "sharding": ["fsdp"], "fsdp_version": 1}, None),  # ring runs on FSDP2
    ({"seq_len": 32768, "sharding": ["fsdp-hybrid"]}, None),  # one node: no hybrid sharding
    ({"seq_len": 32768, "gpus": "2x8xH100-80", "sharding": ["fsdp-hybrid"]}, ["none", "ring x2", "ring x4"]),
    ({"seq_len": 32768, "method": ["dpo"]}, None),  # its loss over sequence shards is not modelled
    ({"seq_len": 32768, "model": "Qwen/Qwen2.5-7B"}, ["none", "ulysses x2", "ulysses x4"] + R),  # 28 heads
    ({"seq_len": 16392}, ["none"] + U + ["ring x2", "ring x4"]),  # 16,392 = 8 x 2,049: not a multiple of 2 x 8
])
def test_which_degrees_are_searched(over, layouts):
    from planner.engine.degrees import layout_words, sequence_requests
    from planner.engine.suggest import _space_of
    from planner.schema.suggest import SuggestRequest

    request = SuggestRequest(**({"model": LLAMA8, "gpus": "8xH100-80"} | over))
    found = sequence_requests(request, _space_of)
    if layouts is None:  # (from 16,384 tokens, checkpoint offload and, but for FSDP alone, the tiled MLP too)
        fsdp_alone = bool(request.sharding) and all(str(s).startswith("fsdp") for s in request.sharding)
        levered = ({"checkpoint_offload": ["none", "host"]} | ({} if fsdp_alone else {"tiled_mlp": ["none", "tiled"]})
                   if request.seq_len >= 16384 else {})
        assert found == [request.model_copy(update=levered)]
        return
    assert [layout_words((str(r.sequence_parallel[0]), r.sp_size or 1)) for r in found] == layouts
    assert len({_space_of(r).global_batch_size for r in found}) == 1


def test_a_layout_the_flags_rule_out_is_named_not_dropped():
    """--micro-batch-size 4 of a global batch of 8 at 32,768 tokens divides the share of a replica
    of 4 or 8 GPUs only: those are searched, the others named with why."""
    result = _suggest(seq_len=32768, micro_batch_size=[4])
    assert {p.config.sequence_shards for p in result.plans} <= {4, 8} and result.plans
    line = next(r for r in result.reasons if r.startswith("sequence parallelism"))
    assert "not searched: none: --micro-batch-size 4 must divide" in line
    assert "not searched: ulysses x2: --micro-batch-size 4 must divide" in line


@pytest.mark.parametrize("train_batch, refused", [(8, False), ("auto", False), (4, True)])
def test_check_counts_deepspeeds_batch_over_every_rank_under_ulysses(tmp_path, train_batch, refused):
    """DeepSpeed's train_batch_size counts every rank's micro-batches, the sequence-parallel ones
    included (transformers fills "auto" so; its ZeRO-3 init refuses the replicas' count, which the
    live Ulysses launch hit): micro-batch 1 x accumulation 4 x 2 GPUs = 8 is read, 4 refused."""
    import json

    import yaml

    from planner.check import CheckRequest, check
    from planner.core.errors import PlannerInputError

    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 3}, "bf16": {"enabled": True},
                              "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4,
                              "train_batch_size": train_batch}))
    acc = tmp_path / "a.yaml"
    acc.write_text(yaml.safe_dump({"distributed_type": "DEEPSPEED", "num_processes": 2,
                                   "deepspeed_config": {"deepspeed_config_file": str(ds)},
                                   "parallelism_config": {"parallelism_config_sp_size": 2,
                                                          "parallelism_config_sp_backend": "deepspeed"}}))
    request = CheckRequest(model=LLAMA8, gpus="2xH100-80", accelerate_config=acc, seq_len=32768, alternatives=0)
    if refused:
        with pytest.raises(PlannerInputError, match="train_batch_size = 4, but micro-batch 1 x accumulation 4 x 2 "
                                                    "GPUs = 8"):
            check(request)
    else:
        c = check(request).estimate.config
        assert (c.sequence_shards, c.micro_batch_size, c.grad_accum) == (2, 1, 4)


def test_a_trainer_arguments_parallelism_config_is_refused_not_ignored(tmp_path):
    """TrainingArguments' parallelism_config read from a file stays a dict, which accelerate's
    Accelerator refuses at start (checked here with the installed libraries); check says so rather
    than plan the job without it."""
    import json

    pytest.importorskip("accelerate")
    from accelerate import Accelerator
    from transformers import HfArgumentParser, TrainingArguments

    from planner.check import CheckRequest, check
    from planner.core.errors import PlannerInputError

    parsed = HfArgumentParser(TrainingArguments).parse_dict({"output_dir": str(tmp_path / "o"),
                                                            "parallelism_config": {"sp_size": 1}})[0]
    assert isinstance(parsed.parallelism_config, dict)
    from accelerate.state import AcceleratorState

    try:
        with pytest.raises(AttributeError):
            Accelerator(parallelism_config=parsed.parallelism_config)
    finally:
        AcceleratorState._reset_state(True)  # (the singleton a later test's Accelerator would find)
    args = tmp_path / "t.json"
    args.write_text(json.dumps({"output_dir": "o", "per_device_train_batch_size": 1, "bf16": True,
                                "parallelism_config": {"sp_size": 4}}))
    with pytest.raises(PlannerInputError, match="parallelism_config in Trainer arguments read from a file stays a dict"):
        check(CheckRequest(model=LLAMA8, gpus="8xH100-80", training_args=args, seq_len=32768, alternatives=0))


def test_padded_rows_of_a_split_sequence_are_padded_to_the_degree_and_modelled_so():
    """Padded batches under Ulysses pad each row up to a multiple of sp_size (ring: 2 x sp_size):
    the longest micro-batch's rows, the expected padded length the kernels run (the longest of the
    batch's samples, each rounded up: rounding is monotone) and the real tokens (not rounded)."""
    from planner.core.lengths import Batching, Lengths, shape
    from planner.engine.space import build_space
    from planner.launch.data import Padded
    from planner.strategies.sequence_parallel import pad_multiple

    lengths = Lengths(((1000, 3), (30001, 1)), "test")
    assert lengths.rounded(8).counts == ((1000, 3), (30008, 1))
    assert lengths.rounded(16).counts == ((1008, 3), (30016, 1))
    rows = shape(Batching.PADDED, 32768, lengths, 2, 16)
    assert rows.memory == 30016
    assert rows.kernel == pytest.approx(1008 * (3 / 4) ** 2 + 30016 * (1 - (3 / 4) ** 2))
    assert rows.real == pytest.approx((3 * 1000 + 30001) / 4)
    get = {"sequence_parallel": "ring", "sp_size": 8}.get
    assert pad_multiple(get) == 16 and pad_multiple({"sequence_parallel": "ulysses", "sp_size": 8}.get) == 8
    assert pad_multiple({"sequence_parallel": "none", "sp_size": 8}.get) == 1
    space = build_space(8, 32768, {"sequence_parallel": ["ulysses"], "sharding": ["zero3"]}, settings={"sp_size": 8},
                        batching=Batching.PADDED, lengths=lengths)
    assert space.seq_len == 30008 and space.seq_len % 8 == 0
    batch = Padded(0, None, 8)([{"input_ids": [1] * 5}, {"input_ids": [1] * 3}])
    assert batch["input_ids"].shape == (2, 8) and batch["labels"][0, 5:].tolist() == [-100] * 3


def test_a_padded_ulysses_plan_is_checked_with_its_rounded_rows():
    """The check rules of a padded plan under Ulysses: its rows (the longest, rounded up) divide
    by the degree; no refusal for padding."""
    ctx = _ctx(32768, 8, batching="padded")
    assert not [c for c in check_config(ctx).codes if "padded" in c]


def test_the_launch_reads_a_ring_plans_own_files_whatever_the_world(tmp_path):
    """The planner launch reads the emitted files without the GPU count (its world is the launcher's):
    a ring plan's parallelism sizes (dp_shard x cp = 8) are not held against one GPU."""
    from planner.emit import build_files, single_plan_result
    from planner.engine.estimate import estimate
    from planner.launch.train import plan_config
    from planner.schema.estimate import EstimateRequest

    plan = estimate(EstimateRequest(model="meta-llama/Llama-3.1-8B", gpus="8xH100-80", sharding="fsdp",
                                    sequence_parallel="ring", sp_size=2, seq_len=32768, checkpointing="full"))
    for name, text in build_files(single_plan_result(plan)).items():
        if name.endswith((".json", ".yaml")):
            (tmp_path / name).write_text(text)
    assert "parallelism_config_cp_size: 2" in (tmp_path / "accelerate_config.yaml").read_text()
    config = plan_config(tmp_path)
    assert (str(config.sequence_parallel), config.sp_size) == ("ring", 2)
