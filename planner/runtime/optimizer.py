"""The optimizer a plan trains with: the class its value's implementation names on this engine
(strategies/optimizer.py ``CHOICES``: what the emitted Trainer ``optim`` makes transformers build,
or what the runtime builds from runtime.json where the Trainer has no name for it)."""

import importlib

from strategies.optimizer import CHOICES, Optimizer

LEARNING_RATE = 1e-4


def build(name: str, model, cfg=None, *, lr: float = LEARNING_RATE, fsdp2: bool = False, fused: bool | None = None,
          fake: bool = False):
    """The optimizer for ``model``'s trainable parameters; ``cfg`` is the transformers config
    (Adam-mini's head counts); ``fsdp2``: the parameters are FSDP2's DTensor shards (the value's
    FSDP2 implementation, where it has one). ``fake``: under fake tensors, None for the
    implementations that cannot run there (their states are then computed). Raises ImportError
    with what to install when a package is missing."""
    import torch

    impl = CHOICES[Optimizer(name)].impl_for(fsdp2)
    if fake and not impl.fake:
        return None
    try:
        cls = getattr(importlib.import_module(impl.module), impl.cls)
    except ImportError:
        raise ImportError(f"{name} needs {impl.library or impl.module} (pip install {impl.library or impl.module}"
                          f"{'; CUDA' if impl.library == 'bitsandbytes' else ''})") from None
    params = [p for p in model.parameters() if p.requires_grad]
    if cls is torch.optim.AdamW:
        if fused is None:
            fused = next(model.parameters()).device.type == "cuda"
        return cls(params, lr=lr, fused=fused)  # the emitted adamw_torch_fused
    if impl.module == "transformers.optimization":  # Adafactor as the Trainer builds it
        return cls(params, lr=lr, relative_step=False, scale_parameter=False)
    if impl.module == "adam_mini":
        return cls(named_parameters=model.named_parameters(), lr=lr, dim=cfg.hidden_size,
                   n_heads=cfg.num_attention_heads, n_kv_heads=getattr(cfg, "num_key_value_heads", None))
    return cls(params, lr=lr)
