"""The optimizer a plan trains with: the class its value's implementation names on this engine
(strategies/optimizer.py ``CHOICES``: what the emitted Trainer ``optim`` makes transformers build,
or what the runtime builds from runtime.json where the Trainer has no name for it)."""

import importlib
from collections.abc import Callable

from planner.strategies.optimizer import CHOICES, Optimizer

LEARNING_RATE = 1e-4


def build(name: str, model, cfg=None, *, lr: float = LEARNING_RATE, fsdp2: bool = False, fused: bool = True,
          fake: bool = False):
    """The optimizer for ``model``'s trainable parameters; ``cfg`` is the transformers config
    (Adam-mini's head counts); ``fsdp2``: the parameters are FSDP2's DTensor shards (the value's
    FSDP2 implementation, where it has one). ``fake``: under fake tensors, None for the
    implementations that cannot run there (their states are then computed). ``fused``: torch
    AdamW's fused kernel on every device, as the Trainer's ``adamw_torch_fused`` passes
    ``fused=True`` (host shards under FSDP2's CPU offload too; torch has a CPU kernel). Raises ImportError
    with what to install when a package is missing."""
    impl = CHOICES[Optimizer(name)].impl_for(fsdp2)
    if fake and not impl.fake:
        return None
    try:
        cls = getattr(importlib.import_module(impl.module), impl.cls)
    except ImportError:
        raise ImportError(f"{name} needs {impl.library or impl.module} (pip install {impl.library or impl.module}"
                          f"{'; CUDA' if impl.library == 'bitsandbytes' else ''})") from None
    params = [p for p in model.parameters() if p.requires_grad]
    return CALLS[impl.call](cls, model, params, cfg, lr, fused)


#: How the runtime calls an implementation's class (strategies/optimizer.py ``Impl.call``), as the
#: Trainer calls it for the emitted optim name: (class, model, trainable parameters, transformers
#: config, learning rate, fused) -> the optimizer.
CALLS: dict[str, Callable] = {
    "params": lambda cls, model, params, cfg, lr, fused: cls(params, lr=lr),
    "fused": lambda cls, model, params, cfg, lr, fused: cls(params, lr=lr, fused=fused),  # adamw_torch_fused
    "adafactor": lambda cls, model, params, cfg, lr, fused: cls(params, lr=lr, relative_step=False,
                                                                scale_parameter=False),
    "named": lambda cls, model, params, cfg, lr, fused: cls(
        named_parameters=model.named_parameters(), lr=lr, dim=cfg.hidden_size, n_heads=cfg.num_attention_heads,
        n_kv_heads=getattr(cfg, "num_key_value_heads", None)),
}
