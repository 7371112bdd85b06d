"""The ZeRO paper's model-state memory, as a reference formula.

Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", Sec. 5.1 / Figure 1: with Psi parameters, K bytes of optimizer state per parameter
(12 for mixed-precision Adam: fp32 master, momentum, variance) and data-parallel degree Nd,
the per-GPU model states are
    baseline (DDP)   (2 + 2 + K) * Psi
    P_os   (ZeRO-1)  2*Psi + 2*Psi + K*Psi / Nd
    P_os+g (ZeRO-2)  2*Psi + (2 + K) * Psi / Nd
    P_os+g+p (ZeRO-3) (2 + 2 + K) * Psi / Nd
Unit: bytes. The paper's example (Psi = 7.5B, K = 12, Nd = 64) gives 120 / 31.4 / 16.6 / 1.88 GB.
"""


def zero_model_state_bytes(psi: float, k: float, stage: int, dp: int) -> float:
    if stage == 0:
        return (2 + 2 + k) * psi
    if stage == 1:
        return 4 * psi + k * psi / dp
    if stage == 2:
        return 2 * psi + (2 + k) * psi / dp
    if stage == 3:
        return (2 + 2 + k) * psi / dp
    raise ValueError(f"ZeRO stage must be 0-3, not {stage}")
