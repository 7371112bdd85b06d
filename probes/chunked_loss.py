"""A fused linear + cross-entropy loss with Liger-Kernel's allocation pattern, in plain PyTorch.

The plan's chunked loss is Liger-Kernel's ``LigerFusedLinearCrossEntropyFunction`` (emitted as
``use_liger_kernel``); its Triton kernel does not run on a CPU or under fake tensors, so the traced
probe runs this re-implementation, which allocates what Liger allocates (source:
Liger-Kernel ops/fused_linear_cross_entropy.py, reduction "mean", chunk_mem_const 1):

- in forward, before the chunks: ``grad_input`` (tokens x h, the input's dtype), ``grad_weight``
  (V x h, the weight's dtype; it becomes the head's gradient), ``loss_1d`` (tokens, fp32);
- per chunk of ``min(next_pow2(ceil(tokens / ceil(V / h))), tokens)`` tokens: the logits chunk in
  the matmul's dtype, which the cross-entropy kernel overwrites with its gradient in place; the
  chunk's input gradient; the weight gradient accumulated with ``addmm(out_dtype=fp32)``;
- backward returns the saved gradients (the loss is the last op: grad_output is 1).

Numerics are a stand-in (the probe traces memory, not values).
"""

import torch

from planner.cost.activations import liger_chunk_tokens


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor):
        tokens, hidden = x.shape
        step = liger_chunk_tokens(tokens, weight.shape[0], hidden)
        grad_input = torch.zeros_like(x)
        grad_weight = torch.zeros_like(weight)
        loss_1d = torch.zeros(tokens, dtype=torch.float32, device=x.device)
        for start in range(0, tokens, step):
            xc, tc = x[start:start + step], target[start:start + step]
            logits = xc @ weight.t()
            lse = torch.logsumexp(logits, dim=-1, keepdim=True)
            loss_1d[start:start + step] = (lse.squeeze(-1) - logits.gather(-1, tc.unsqueeze(-1)).squeeze(-1)).float()
            grad = logits.sub_(lse).exp_()  # the kernel writes the gradient over the logits
            grad.scatter_add_(-1, tc.unsqueeze(-1), torch.full_like(tc.unsqueeze(-1), -1, dtype=grad.dtype))
            grad.div_(tokens)
            grad_input[start:start + step] = grad @ weight
            operand = xc if xc.dtype == grad.dtype else xc.to(grad.dtype)
            if grad_weight.dtype == grad.dtype:
                grad_weight.addmm_(grad.t(), operand)
            else:
                torch.addmm(grad_weight, grad.t(), operand, out_dtype=grad_weight.dtype, out=grad_weight)
            del logits, grad, operand
        ctx.save_for_backward(grad_input, grad_weight)
        return loss_1d.sum() / tokens

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad_output):
        grad_input, grad_weight = ctx.saved_tensors
        return grad_input, grad_weight, None


def chunked_causal_lm_forward(model):
    """A forward for ``model`` (a transformers causal LM) whose loss is the chunked one.

    Installed as the instance's ``forward`` so module hooks (FSDP's unshard of the root) still run.
    Labels are shifted as transformers does (pad with -100 on the right, drop the first), and the
    ignored positions are mapped to class 0: the allocations do not depend on them. Position ids
    (a Ulysses rank's) go to the decoder.
    """
    body, head = model.get_decoder(), model.get_output_embeddings()

    def forward(input_ids, labels, position_ids=None):
        hidden = body(input_ids=input_ids, position_ids=position_ids).last_hidden_state
        shifted = torch.nn.functional.pad(labels, (0, 1), value=0)[..., 1:]
        flat = hidden.reshape(-1, hidden.shape[-1])
        return ChunkedLinearCrossEntropy.apply(flat, head.weight, shifted.reshape(-1))

    return forward
