"""Channel incoherence Ψ (RotateAttention Eq. 1-2) and its per-RoPE-segment summary.

For X [N, D] (rows = tokens): E[X] = mean over tokens, and

    Ψ(X)_c = max_i |X_{i,c} - E[X]_c|,

the largest deviation of channel c from its own mean — what per-token quantization has to fit
into its range after mean smoothing. Outliers show up as a few channels with large Ψ.
"""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["incoherence", "incoherence_summary", "profile_correlation"]

SEGMENT_NAMES = ("t", "h", "w")


def incoherence(x: torch.Tensor) -> torch.Tensor:
    """Ψ per channel for x [..., N, D] (token axis second to last, e.g. BHND).

    Returns float64 [..., D]."""
    if x.dim() < 2 or x.shape[-2] < 1:
        raise ValueError(f"x must be [..., N, D] with N >= 1 tokens, got {tuple(x.shape)}")
    xd = x.to(torch.float64)
    return (xd - xd.mean(dim=-2, keepdim=True)).abs().amax(dim=-2)


def profile_correlation(psi_a: torch.Tensor, psi_b: torch.Tensor) -> float:
    """Pearson correlation of two Ψ profiles [..., D] (flattened), e.g. Q's and K's: near 1
    when the two share their outlier channels (the paper's cross-matrix symmetry)."""
    if psi_a.shape != psi_b.shape:
        raise ValueError(f"psi_a and psi_b must have the same shape, got {tuple(psi_a.shape)} and {tuple(psi_b.shape)}")
    a = psi_a.to(torch.float64).flatten()
    b = psi_b.to(torch.float64).flatten()
    a, b = a - a.mean(), b - b.mean()
    denom = a.norm() * b.norm()
    if denom == 0:
        raise ValueError("a profile is constant: correlation undefined")
    return float((a @ b) / denom)


def incoherence_summary(psi: torch.Tensor, segments: Sequence[int] | None = None) -> dict[str, dict[str, float]]:
    """Summarize Ψ [..., D] per RoPE segment (leading dims, e.g. heads, are averaged first).

    Args:
        psi: output of :func:`incoherence`.
        segments: RoPE segment sizes (t, h, w); None = one segment of D named "all".

    Returns:
        {segment name: stats} plus "all", each with float entries:
        ``mean``, ``max``, ``peak_to_mean`` (max/mean: 1 = flat, large = a few outlier channels),
        ``first_half_mean`` / ``second_half_mean`` (channels [0, D_j/2) and [D_j/2, D_j) of the
        segment: in diffusers' interleaved layout the first half holds the high-frequency RoPE
        pairs), and ``half_ratio`` = larger / smaller half mean.
    """
    if psi.dim() < 1:
        raise ValueError(f"psi must be [..., D], got {tuple(psi.shape)}")
    profile = psi.to(torch.float64).reshape(-1, psi.shape[-1]).mean(0)
    d = profile.shape[0]
    if segments is None:
        named = [("all", 0, d)]
    else:
        segs = [int(s) for s in segments]
        if sum(segs) != d or any(s < 2 for s in segs) or len(segs) > len(SEGMENT_NAMES):
            raise ValueError(f"segments must be up to 3 sizes >= 2 summing to D={d}, got {segments!r}")
        named, offset = [], 0
        for name, size in zip(SEGMENT_NAMES, segs):
            named.append((name, offset, offset + size))
            offset += size
        named.append(("all", 0, d))
    out = {}
    for name, start, stop in named:
        seg = profile[start:stop]
        half = (stop - start) // 2
        first, second = seg[:half].mean(), seg[half:].mean()
        mean = seg.mean()
        out[name] = {
            "mean": float(mean),
            "max": float(seg.max()),
            "peak_to_mean": float(seg.max() / mean) if mean > 0 else float("inf"),
            "first_half_mean": float(first),
            "second_half_mean": float(second),
            "half_ratio": float(torch.maximum(first, second) / torch.minimum(first, second))
            if torch.minimum(first, second) > 0
            else float("inf"),
        }
    return out
