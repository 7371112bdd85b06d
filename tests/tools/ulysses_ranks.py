"""Two-rank (or one-rank) run of a tiny Llama through DeepSpeed's Ulysses attention over gloo, as
accelerate registers it for a Trainer run (``UlyssesSPAttentionHF.register_with_transformers``),
the loss computed as transformers' ``deepspeed_sp_compute_loss`` does (each rank's loss over its
pre-shifted labels, weighted by its valid tokens). Prints one JSON line: the loss, the gradient
norm of the embeddings (summed over the group), and the bytes of the tensors autograd saved in
the forward (distinct storages, the parameters left out).

    python ulysses_ranks.py MODEL_DIR SEQ RANK WORLD PORT     (WORLD 1: no Ulysses, SEQ tokens)
"""

import json
import os
import sys

import torch


def main() -> None:
    folder, seq, rank, world, port = sys.argv[1], *map(int, sys.argv[2:6])
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).float()
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                          LOCAL_RANK=str(rank))
        import deepspeed
        from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

        deepspeed.init_distributed(dist_backend="gloo", verbose=False)
        UlyssesSPAttentionHF.register_with_transformers(model, "sdpa", world, 1, seq_length_is_variable=True)
    ids = torch.randint(0, config.vocab_size, (1, seq), generator=torch.Generator().manual_seed(1))
    shift = torch.nn.functional.pad(ids, (0, 1), value=-100)[:, 1:]
    local = slice(rank * seq // world, (rank + 1) * seq // world)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(input_ids=ids[:, local], position_ids=torch.arange(seq)[None, local], labels=shift[:, local],
                    shift_labels=shift[:, local])
    good = (shift[:, local] != -100).sum().float()
    loss = out.loss * good
    if world > 1:
        import torch.distributed as dist

        total = torch.stack([loss.detach(), good])
        dist.all_reduce(total)
        loss = loss / total[1]
        loss.backward()
        grad = model.get_input_embeddings().weight.grad
        dist.all_reduce(grad)
        value = (total[0] / total[1]).item()
    else:
        loss = loss / good
        loss.backward()
        grad, value = model.get_input_embeddings().weight.grad, loss.item()
    print(json.dumps({"loss": value, "grad_norm": grad.norm().item(), "saved_bytes": sum(saved.values())}), flush=True)
    if world > 1:  # (left to exit, gloo's threads can abort the rank: planner/launch/train.py)
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
