"""Quantizers the recipes share (per-token INT4 / INT8, per-channel FP8, e4m3 rounding), used by their reference
twins and the kernels' tests; a quantizer only one recipe uses is in that recipe's ``reference.py``
(``rotvid/kernels/recipes/<name>/reference.py``: the INT4 V groups and P levels, the int8-fp8 K groups, NVFP4).

Rounding everywhere is **round half to even** (``torch.round``; in CUDA ``__float2int_rn`` /
``cvt.rni``). Every function here is the exact model of a kernel step; see
``rotvid/kernels/reference.py`` for where each one is used.

Integer results are returned in ``torch.int8`` (values only; the kernels pack INT4 values
into nibbles or keep them in int8 registers, which gives identical products).
"""

from __future__ import annotations

import torch

INT4_QMAX = 7  # symmetric INT4 grid for Q, K, V: [-7, 7]
INT8_QMAX = 127
FP8_E4M3_MAX = 448.0


def symmetric_quantize(x: torch.Tensor, amax: torch.Tensor, qmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x_hat = clamp(rint(x * (qmax / amax)), -qmax, qmax), scale = amax / qmax; amax == 0 -> 0."""
    x = x.float() if x.dtype != torch.float64 else x
    amax = amax.to(x.dtype)
    zero = amax == 0
    safe = torch.where(zero, torch.ones_like(amax), amax)
    # Tensor / tensor divisions: IEEE-rounded quotients, as the CUDA kernels compute them
    # (a Python scalar divisor or dividend may be turned into a reciprocal multiply by torch).
    q = torch.full_like(safe, qmax)
    inv = torch.where(zero, torch.zeros_like(amax), q / safe)
    x_hat = torch.round(x * inv).clamp_(-qmax, qmax)
    scale = torch.where(zero, torch.zeros_like(amax), safe / q)
    return x_hat.to(torch.int8), scale


def quantize_per_token_int4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token symmetric INT4 of ``x`` [..., N, D] along D.

    Returns ``(x_hat, scale)``: ``x_hat`` int8 [..., N, D] in [-7, 7] and ``scale`` [..., N, 1]
    (float32, or float64 for float64 input) with ``x ≈ x_hat * scale``.
    """
    amax = x.abs().amax(dim=-1, keepdim=True)
    return symmetric_quantize(x, amax, INT4_QMAX)


def quantize_per_token_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token symmetric INT8 of ``x`` [..., N, D]: ``x_hat`` in [-127, 127], ``scale`` [..., N, 1]."""
    amax = x.abs().amax(dim=-1, keepdim=True)
    return symmetric_quantize(x, amax, INT8_QMAX)


def pad_to_blocks(x: torch.Tensor, block: int, dim: int = -2) -> torch.Tensor:
    """Zero-pad ``x`` along ``dim`` to a multiple of ``block``."""
    n = x.shape[dim]
    pad = (-n) % block
    if pad == 0:
        return x
    shape = list(x.shape)
    shape[dim] = pad
    return torch.cat([x, x.new_zeros(shape)], dim=dim)


def key_valid_mask(n_kv: int, kv_lens: torch.Tensor | None, batch: int, device) -> torch.Tensor:
    """Bool [B, 1, N_kv, 1]: key j of batch b is valid iff j < kv_lens[b]."""
    j = torch.arange(n_kv, device=device)
    if kv_lens is None:
        return torch.ones(batch, 1, n_kv, 1, dtype=torch.bool, device=device)
    return (j[None, :] < kv_lens.to(device)[:, None]).view(batch, 1, n_kv, 1)


def round_to_fp8_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest FP8 e4m3 value (saturating at ±448), returned in x's float dtype."""
    return x.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn).to(x.dtype)


def quantize_per_channel_fp8(v: torch.Tensor, valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel FP8 e4m3 of ``v`` [..., N, D] (SageAttention2's V): scale = amax / 448 per channel.

    Returns ``(v_q, scale)`` with ``v_q`` the e4m3 values stored in float32 and scale [..., 1, D].
    """
    v = v.float() if v.dtype != torch.float64 else v
    if valid is not None:
        v = v * valid.to(v.dtype)
    amax = v.abs().amax(dim=-2, keepdim=True)
    # tensor / tensor: the IEEE-rounded quotient the CUDA pre-processing computes (a Python scalar divisor may
    # become a reciprocal multiply)
    scale = torch.where(amax == 0, torch.ones_like(amax), amax / torch.full_like(amax, FP8_E4M3_MAX))
    return round_to_fp8_e4m3(v / scale), scale


def quant_p_fp8(p: torch.Tensor) -> torch.Tensor:
    """P in [0, 1] scaled by 448 and rounded to e4m3 (SageAttention2's P); divide by 448 to use."""
    return round_to_fp8_e4m3(p * FP8_E4M3_MAX)


