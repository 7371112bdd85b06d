"""Preference optimization as TRL's DPOTrainer runs it: the paired batch, the reference model and
the log-probabilities, per TRL version.

Facts read from TRL's code (trl/trainer/dpo_trainer.py, trl/trainer/utils.py,
trl/kernels/chunked_logprob.py, trl/models/utils.py; releases 1.10.0-1.16.0, and main of
2026-07-24) and checked against the installed TRL on real CPU tensors (tests/test_preference.py):

- **The paired batch.** ``DataCollatorForPreference`` puts every pair's prompt + chosen and
  prompt + rejected on the batch axis (chosen rows first), each cut at ``max_length`` and padded
  to the longest: a micro-batch of ``per_device_train_batch_size`` pairs runs ``ROWS_PER_PAIR``
  times as many sequences through the model.
- **The reference model.** With no ``ref_model`` given, DPOTrainer loads a second copy of the
  policy from its path (``create_model_from_path``, the policy's own dtype unless
  ``model_init_kwargs`` names one), frozen, dropout off; none when the policy is a peft model
  (the adapter-disabled base is the reference) or with ``precompute_ref_log_probs`` (except under
  FSDP, where the precompute loads one and frees it before training). It is prepared like the
  policy: sharded under FSDP and ZeRO-3; under ZeRO-1/2 DeepSpeed runs it at stage 0, a whole
  copy on every GPU (``prepare_deepspeed``: "the reference model fits in memory and is
  initialized on each device with ZeRO disabled"); DDP keeps a whole copy too.
- **The log-probabilities.** Up to TRL 1.14 the policy forward returns the full logits and
  ``selective_log_softmax`` takes each row's log-softmax (16-bit logits: the row's output is
  saved for backward; fp32 logits: ``logsumexp`` row by row, which keeps its input, the logits);
  then the reference forward, under ``no_grad``, makes its own full logits while the policy's are
  alive. From TRL 1.15 both forwards run the backbone and ``add_fused_lm_head``'s chunked
  log-probability kernel (``_ChunkedLogProbFunction``): no logits at all, only a projection
  buffer of ``min(tokens, TOKEN_CHUNK)`` x ``VOCAB_CHUNK`` elements in the compute dtype, per-token
  fp32 statistics, and in backward fp32 accumulators for the hidden states' gradient and (when the
  head trains) the head's.
"""

from planner.core.specs import ModelSpec
from planner.core.vocabulary import ROWS_PER_SAMPLE

#: Sequences per preference pair in a micro-batch: prompt + chosen and prompt + rejected
#: (trl DataCollatorForPreference.torch_call: ``input_ids = prompt_chosen_ids + prompt_rejected_ids``).
ROWS_PER_PAIR = ROWS_PER_SAMPLE["dpo"]

#: The first TRL release whose DPOTrainer computes log-probabilities with the fused, chunked LM
#: head (``add_fused_lm_head``; 1.14.0's dpo_trainer.py still calls ``selective_log_softmax``).
FUSED_LOGPROBS_SINCE = (1, 15)
#: Tokens per projection tile of the chunked log-probability kernel (trl/kernels/chunked_logprob.py
#: ``TOKEN_CHUNK_SIZE``, TRL 1.15-1.16).
TOKEN_CHUNK = 4096
#: Vocabulary entries per projection tile (trl/trainer/utils.py ``_CHUNKED_LOGPROB_CHUNK_SIZE``):
#: the buffer is this wide even for a smaller vocabulary.
VOCAB_CHUNK = 32768
#: fp32 per-token vectors the kernel's forward keeps: running max, sum of exponentials and its
#: weighted sums, the target's logit and the running argmax state (7 x ``torch.zeros((N,))``).
STATS_PER_TOKEN = 7


def fused_logprobs(trl_version: tuple[int, ...]) -> bool:
    """Whether TRL ``trl_version`` (major, minor) computes DPO's log-probabilities with the fused
    LM head (no logits; ``FUSED_LOGPROBS_SINCE``)."""
    return trl_version >= FUSED_LOGPROBS_SINCE


def reference_kept(adapter: bool, precompute: bool) -> bool:
    """Whether DPOTrainer holds a reference model through training: not with an adapter (the
    adapter-disabled base is the reference) and not with ``precompute_ref_log_probs`` (the
    log-probabilities are read from the dataset). Source: dpo_trainer.py ``__init__``, "Reference
    model" (TRL 1.16)."""
    return not adapter and not precompute


def reference_divisor(sharded: bool, data_parallel: int) -> int:
    """What each GPU's share of the reference weights is divided by: the data-parallel degree when
    the engine shards parameters (FSDP through ``prepare_fsdp`` with the policy's plugin; ZeRO-3
    through ``prepare_deepspeed``), else 1 (ZeRO-1/2 run it at stage 0; DDP and one GPU hold it
    whole). Unit: a divisor of the model's parameter bytes."""
    return data_parallel if sharded else 1


def reference_weight_bytes(parameters: int, weight_bytes: int, divisor: int) -> int:
    """Bytes per GPU of the reference model's weights: every parameter of the policy's architecture
    in the policy's stored dtype (``weight_bytes``: DPOTrainer loads it with the policy's dtype),
    divided by ``reference_divisor``. Unit: bytes."""
    return -(-parameters * weight_bytes // divisor)


def rows(pairs: int) -> int:
    """Sequences a micro-batch of ``pairs`` preference pairs runs (``ROWS_PER_PAIR`` each)."""
    return ROWS_PER_PAIR * pairs


def projection_buffer_bytes(tokens: int, compute_bytes: int) -> int:
    """Bytes of the fused kernel's projection tile buffer (``mm_buf``), allocated in its forward and
    again in its backward: ``min(tokens, TOKEN_CHUNK)`` x ``VOCAB_CHUNK`` elements of the compute
    dtype (autocast's, else the hidden states'). ``tokens``: the positions scored (the rows' tokens
    less one per row; on Triton devices only those with a label). Unit: bytes."""
    return min(tokens, TOKEN_CHUNK) * VOCAB_CHUNK * compute_bytes


def fused_forward_bytes(tokens: int, hidden: int, compute_bytes: int, hidden_bytes: int) -> int:
    """Bytes the fused log-probability forward adds at its peak, beyond the backbone's output: the
    projection buffer, the per-token fp32 statistics, and the scored positions' hidden states
    gathered by the label mask (``hidden_states[mask]``: a copy, saved for backward; on Triton
    devices, where the kernel scores only labelled positions). Unit: bytes. Assumption: every
    position has a label (a DPO batch masks the prompt, which only lowers it); the CPU fallback's
    own tile temporaries are not counted."""
    return (projection_buffer_bytes(tokens, compute_bytes) + STATS_PER_TOKEN * 4 * tokens
            + tokens * hidden * hidden_bytes)


def fused_backward_bytes(m: ModelSpec, tokens: int, compute_bytes: int, head_trained: bool) -> int:
    """Bytes the fused log-probability backward adds at its peak: the projection buffer again, the
    hidden states' gradient accumulated in fp32 (tokens x h x 4) and, when the head trains, its
    weight gradient accumulated in fp32 (V x h x 4); each is cast to its parameter's or input's
    dtype on return. Unit: bytes. Source: ``_ChunkedLogProbFunction.backward`` ("Always accumulate
    in fp32, even when the inputs are not")."""
    head = m.vocab_size * m.hidden_size * 4 if head_trained else 0
    return projection_buffer_bytes(tokens, compute_bytes) + tokens * m.hidden_size * 4 + head


#: Bytes per (token x V) a full-logits DPO forward leaves alive for its loss: the fp32 logits (the
#: trainer returns them, for its metrics) and log-softmax's saved fp32 output. Source:
#: LLaMA-Factory train/dpo/trainer.py ``concatenated_forward`` (``model(...).logits.to(torch.float32)``)
#: and train/trainer_utils.py ``get_batch_logps`` (``logits[:, :-1].log_softmax(-1)`` gathered at the
#: labels), at hiyouga/LLaMA-Factory@ff6d4d12; tests/test_loss_path.py measures the op sequence.
FULL_LOGPROBS_HELD = 8


def full_logprobs_forward_bytes(v_t: int, c: int, hidden: int) -> int:
    """Peak bytes of one full-logits log-probability forward (LLaMA-Factory's ``concatenated_forward``
    and ``get_batch_logps``) over ``v_t`` = tokens x V logits of ``c`` bytes: the upcast, with the
    head's output and its input (``hidden`` bytes) alive, c + 4 per element (the 16-bit output is a
    temporary of the expression, freed once upcast); then the log-softmax of the shifted view,
    which copies it contiguous first: the fp32 logits, the copy and the output, 12. Unit: bytes.
    Source: as ``FULL_LOGPROBS_HELD``; tests/test_loss_path.py measures it on the CPU allocator."""
    return max((c + 4) * v_t + hidden, (FULL_LOGPROBS_HELD + 4) * v_t)
