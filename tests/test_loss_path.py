"""The standard loss's bytes per transformers loss path, measured on real CPU tensors.

planner's loss moments (strategies/loss.py ``loss_forward_copies``, ``held_output_bytes_per_token``
and activations.logits_bytes) against the CPU allocator's peak (torch profiler memory events, as
planner/probes/real_cpu.py reads them) while a head's bf16 logits go through each path:

- pad-labels: the installed transformers' own ``loss_utils.ForCausalLMLoss`` (>= 4.49);
- shift-logits: transformers 4.46.3's ``ForCausalLMLoss`` (loss/loss_utils.py), its op sequence:
  ``logits.float()``, ``logits[..., :-1, :].contiguous()``, cross-entropy over the flattened copy;
- fp32-logits: transformers 4.44.2's ``LlamaForCausalLM.forward`` after the head (modeling_llama.py):
  ``logits = logits.float()`` (rebinding frees the bf16 output), the shifted contiguous copy, then
  ``CrossEntropyLoss``; the model returns the fp32 logits.

The training loop then drops the output (the Trainer) or holds it through backward (a loop that keeps
``outputs``). A tiny hidden size keeps the input's gradient below 0.2 % of the logits' bytes.
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from planner.cost.activations import FP32, logits_bytes  # noqa: E402
from planner.strategies.loss import LossPath, loss_forward_copies  # noqa: E402

V, H, B, S = 4096, 4, 2, 256
T = B * S
C = 2  # bf16 logits


def _shift_logits_loss(logits, labels):
    logits = logits.float()
    shift_logits = logits[..., :-1, :].contiguous()
    shift_labels = labels[..., 1:].contiguous()
    return torch.nn.functional.cross_entropy(shift_logits.view(-1, V), shift_labels.view(-1))


def _forward(path: LossPath, x, weight, labels):
    """(loss, the output the model returns): the head, then the path's loss."""
    logits = x @ weight.t()
    if path == LossPath.PAD_LABELS:
        from transformers.loss.loss_utils import ForCausalLMLoss

        return ForCausalLMLoss(logits, labels, V), logits
    if path == LossPath.SHIFT_LOGITS:
        return _shift_logits_loss(logits, labels), logits
    logits = logits.float()
    return _shift_logits_loss(logits, labels), logits


def _peaks(path: LossPath, held: bool) -> tuple[int, int]:
    """(forward, backward) peak bytes above the step's start, real CPU allocator."""
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.manual_seed(0)
    x = torch.randn(B, S, H, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(V, H, dtype=torch.bfloat16)
    labels = torch.randint(0, V, (B, S))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with record_function("forward"):
            loss, output = _forward(path, x, weight, labels)
        if not held:
            del output
        with record_function("backward"):
            loss.backward()
    return _span_peaks(prof, ("forward", "backward"))


def _span_peaks(prof, names: tuple[str, ...]) -> tuple[int, ...]:
    """The CPU allocator's peak live bytes (from the profile's start) within each named span."""
    events = prof.profiler.kineto_results.events()
    spans = {e.name(): (e.start_ns(), e.end_ns()) for e in events if e.name() in names}
    peaks, live = dict.fromkeys(spans, 0), 0
    for t, nbytes in sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"):
        live += nbytes
        for phase, (start, end) in spans.items():
            if start <= t <= end:
                peaks[phase] = max(peaks[phase], live)
    return tuple(peaks[n] for n in names)


def _close(measured: int, planned: float) -> bool:
    """Within 2 % below (the shifted copies hold S - 1 of S positions) and 0.5 % above (the input's
    gradient, the loss scalars)."""
    return 0.98 * planned <= measured <= 1.005 * planned


@pytest.mark.parametrize("path", list(LossPath))
@pytest.mark.parametrize("held", [False, True], ids=["dropped", "held"])
def test_each_loss_path_holds_what_planner_counts(path, held):
    forward, backward = _peaks(path, held)
    planned_forward = loss_forward_copies(C, path) * V * T
    held_bytes = ((FP32 if path == LossPath.FP32_LOGITS else C) * V * T) if held else 0
    # the backward's start: log_softmax's saved output, its incoming gradient and its input gradient
    planned_backward = logits_bytes_bf16() * T + held_bytes
    assert _close(forward, planned_forward), (path, forward, planned_forward)
    assert _close(backward, planned_backward), (path, held, backward, planned_backward)


def logits_bytes_bf16() -> float:
    """activations.logits_bytes for a model of vocabulary V without soft-capping: 12 V."""
    from types import SimpleNamespace

    return logits_bytes.__wrapped__(SimpleNamespace(vocab_size=V, final_logit_softcapping=None),
                                    SimpleNamespace(compute=C))


def test_the_older_paths_hold_more_than_todays():
    """The order the releases imply: 4.46-4.48 hold the most in forward, <= 4.45 as much as the
    backward's start, >= 4.49 the least."""
    fwd = {p: _peaks(p, held=False)[0] for p in LossPath}
    assert fwd[LossPath.SHIFT_LOGITS] > fwd[LossPath.FP32_LOGITS] > fwd[LossPath.PAD_LABELS]


def _llamafactory_logps(x, weight, labels):
    """LLaMA-Factory's DPO log-probabilities over a head's output (train/dpo/trainer.py
    ``concatenated_forward``, train/trainer_utils.py ``get_batch_logps`` at @ff6d4d12): the
    logits upcast in one expression (the 16-bit output a temporary), the labels shifted, the
    log-softmax of the shifted view gathered at them; returns (log-probabilities, the fp32 logits,
    which the trainer returns beside them)."""
    all_logits = (x @ weight.t()).to(torch.float32)
    shifted = labels[:, 1:].clone()
    logps = torch.gather(all_logits[:, :-1, :].log_softmax(-1), dim=2, index=shifted.unsqueeze(2)).squeeze(2)
    return logps.sum(-1), all_logits


def test_llamafactory_dpo_holds_what_planner_counts():
    """The full-logits DPO path (strategies/method.py ``full_logits``): the policy's forward
    leaves its fp32 logits and the log-softmax output (8 V per token: ``FULL_LOGPROBS_HELD``); the
    reference forward, under no_grad with those alive, peaks at ``full_logprobs_forward_bytes``
    beside them; the backward starts as the standard loss's (12 V: activations.logits_bytes)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from planner.cost.preference import FULL_LOGPROBS_HELD, full_logprobs_forward_bytes

    torch.manual_seed(0)
    x = torch.randn(B, S, H, dtype=torch.bfloat16, requires_grad=True)
    reference_x = torch.randn(B, S, H, dtype=torch.bfloat16)
    weight = torch.randn(V, H, dtype=torch.bfloat16)
    labels = torch.randint(0, V, (B, S))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with record_function("policy"):
            logps, all_logits = _llamafactory_logps(x, weight, labels)
        with record_function("reference"), torch.no_grad():
            reference = _llamafactory_logps(reference_x, weight, labels)[0]  # its logits freed on return
        loss = -torch.nn.functional.logsigmoid(logps - reference).mean()
        del all_logits  # the trainer's outputs dict, dropped once the loss is computed
        with record_function("backward"):
            loss.backward()
    policy, reference_peak, backward = _span_peaks(prof, ("policy", "reference", "backward"))
    v_t = V * T
    assert _close(policy, full_logprobs_forward_bytes(v_t, C, 0)), policy
    assert _close(reference_peak, FULL_LOGPROBS_HELD * v_t + full_logprobs_forward_bytes(v_t, C, 0)), reference_peak
    assert _close(backward, logits_bytes_bf16() * T), backward
