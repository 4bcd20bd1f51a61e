"""Accuracy metrics between a reference tensor and an approximation (computed in float64)."""

from __future__ import annotations

import math

import torch


def _pair(ref: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if ref.shape != x.shape:
        raise ValueError(f"x: expected shape {tuple(ref.shape)} (the reference's), got {tuple(x.shape)}")
    return ref.detach().double().flatten(), x.detach().double().flatten().to(ref.device)


def cosine_similarity(ref: torch.Tensor, x: torch.Tensor) -> float:
    """Cosine of the angle between the flattened tensors (1.0 for two all-zero tensors)."""
    a, b = _pair(ref, x)
    na, nb = a.norm(), b.norm()
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0:
        return 0.0
    return float(torch.dot(a, b) / (na * nb))


def relative_l2(ref: torch.Tensor, x: torch.Tensor) -> float:
    """‖x − ref‖₂ / ‖ref‖₂ (inf when ref is zero and x is not, 0 when both are zero)."""
    a, b = _pair(ref, x)
    err, nrm = (b - a).norm(), a.norm()
    if nrm == 0:
        return 0.0 if err == 0 else math.inf
    return float(err / nrm)


def sqnr_db(ref: torch.Tensor, x: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio 10·log10(‖ref‖² / ‖x − ref‖²) in dB (inf when exact)."""
    a, b = _pair(ref, x)
    noise = (b - a).square().sum()
    if noise == 0:
        return math.inf
    return float(10.0 * torch.log10(a.square().sum() / noise))


def max_abs_error(ref: torch.Tensor, x: torch.Tensor) -> float:
    """max |x − ref|."""
    a, b = _pair(ref, x)
    return float((b - a).abs().max()) if a.numel() else 0.0


def summarize(ref: torch.Tensor, x: torch.Tensor) -> dict[str, float]:
    """All four metrics as a dict."""
    return {
        "cosine": cosine_similarity(ref, x),
        "rel_l2": relative_l2(ref, x),
        "sqnr_db": sqnr_db(ref, x),
        "max_abs": max_abs_error(ref, x),
    }
