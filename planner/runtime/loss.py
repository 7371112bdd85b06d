"""The chunked loss in a process the probes build: Liger-Kernel's fused linear cross-entropy (what the
emitted ``use_liger_kernel`` makes the Trainer apply at the launch), or, where it cannot run (no CUDA
/ Triton, fake tensors), the probes' stand-in."""

from planner.runtime import Site
from planner.strategies.loss import LIGER_LAYER_KERNELS_OFF, Loss


def prepare(model, config, site: Site, chunked_fallback=None, **_) -> str | None:
    if config.loss != Loss.CHUNKED or site == Site.LAUNCH:  # at the launch the Trainer applies use_liger_kernel
        return None
    error = "fake tensors"
    if site != Site.TRACED:
        try:
            from liger_kernel.transformers import _apply_liger_kernel_to_instance

            _apply_liger_kernel_to_instance(model=model, fused_linear_cross_entropy=True, **LIGER_LAYER_KERNELS_OFF)
            return "chunked loss: Liger-Kernel fused linear cross-entropy"
        except Exception as e:  # not installed, or no Triton here
            error = type(e).__name__
    if chunked_fallback is None:
        return f"chunked loss unavailable here ({error}); the standard loss runs"
    model.forward = chunked_fallback(model)
    return (f"chunked loss: Liger-Kernel unavailable ({error}); its allocations re-implemented in PyTorch "
            "(probes/chunked_loss.py): the memory is Liger's, the speed is not")
