"""The optimizer a plan trains with: the class the emitted Trainer ``optim`` name makes transformers
build (torch fused AdamW, bitsandbytes 8-bit / paged / Lion, transformers Adafactor, torch SGD),
Adam-mini from the adam-mini package, and torchao's 8-bit AdamW under FSDP2 (bitsandbytes' does not
work on sharded DTensor parameters)."""

from strategies.optimizer import Optimizer

LEARNING_RATE = 1e-4
#: bitsandbytes classes by vocabulary name (CUDA only).
BITSANDBYTES = {
    Optimizer.ADAMW_8BIT: "AdamW8bit", Optimizer.PAGED_ADAMW: "PagedAdamW32bit",
    Optimizer.PAGED_ADAMW_8BIT: "PagedAdamW8bit", Optimizer.LION: "Lion32bit", Optimizer.LION_8BIT: "Lion8bit",
}


def build(name: str, model, cfg=None, *, lr: float = LEARNING_RATE, fsdp: bool = False, fused: bool | None = None,
          fake: bool = False):
    """The optimizer for ``model``'s trainable parameters; ``cfg`` is the transformers config
    (Adam-mini's head counts). ``fake``: under fake tensors, None for the kernels that cannot run
    there (bitsandbytes, Adam-mini: their states are then computed). Raises ImportError with what to
    install when a package is missing."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    if fused is None:
        fused = next(model.parameters()).device.type == "cuda"
    if name == Optimizer.ADAMW:
        return torch.optim.AdamW(params, lr=lr, fused=fused)  # the emitted adamw_torch_fused
    if name == Optimizer.SGD:
        return torch.optim.SGD(params, lr=lr)
    if name == Optimizer.ADAFACTOR:
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=lr, relative_step=False, scale_parameter=False)
    if fake:
        return None
    if name == Optimizer.ADAM_MINI:
        try:
            from adam_mini import Adam_mini
        except ImportError:
            raise ImportError("adam-mini is not installed (pip install adam-mini)") from None
        return Adam_mini(named_parameters=model.named_parameters(), lr=lr, dim=cfg.hidden_size,
                         n_heads=cfg.num_attention_heads, n_kv_heads=getattr(cfg, "num_key_value_heads", None))
    if name == Optimizer.ADAMW_8BIT and fsdp:
        from torchao.optim import AdamW8bit

        return AdamW8bit(params, lr=lr)
    try:
        import bitsandbytes as bnb
    except ImportError:
        raise ImportError(f"{name} needs bitsandbytes (pip install bitsandbytes; CUDA)") from None
    return getattr(bnb.optim, BITSANDBYTES[Optimizer(name)])(params, lr=lr)
