"""Quantizers shared by the reference attention and the kernels' tests.

Rounding everywhere is **round half to even** (``torch.round``; in CUDA ``__float2int_rn`` /
``cvt.rni``). Every function here is the exact model of a kernel step; see
``/rotvid/kernels/reference.py`` for where each one is used.

Integer results are returned in ``torch.int8`` (values only; the kernels pack INT4 values
into nibbles or keep them in int8 registers, which gives identical products).
"""

from __future__ import annotations

import torch

INT4_QMAX = 7  # symmetric INT4 grid for Q, K, V: [-7, 7]
INT8_QMAX = 127
FP8_E4M3_MAX = 448.0
P_RANGE_SCALE = 15  # range-optimized P: round(15 p) - 8 in [-8, 7]
P_RANGE_ZERO = 8
P_SYM_SCALE = 7  # symmetric P (paper Eq. 11): round(7 p) in [0, 7]

E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
NVFP4_BLOCK = 16


def _symmetric_quantize(x: torch.Tensor, amax: torch.Tensor, qmax: int) -> tuple[torch.Tensor, torch.Tensor]:
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
    return _symmetric_quantize(x, amax, INT4_QMAX)


def quantize_per_token_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token symmetric INT8 of ``x`` [..., N, D]: ``x_hat`` in [-127, 127], ``scale`` [..., N, 1]."""
    amax = x.abs().amax(dim=-1, keepdim=True)
    return _symmetric_quantize(x, amax, INT8_QMAX)


K_GROUP_BLOCK = 128  # keys per block of the int8-fp8 kernel
K_GROUPS = 4  # key groups per block: the keys one thread of the kernel's score fragment holds


def k_group_of_key(j: torch.Tensor) -> torch.Tensor:
    """The group (0-3) of key ``j`` inside its block of 128: ``(j mod 8) // 2``, the accumulator columns
    8i + 2t, 8i + 2t + 1 (i = 0..15) that thread ``t`` of a quad holds in the kernel's score fragment."""
    return (j % 8) // 2


def quantize_k_groups_int8(
    k: torch.Tensor, kv_lens: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """INT8 of ``k`` [B, H, N, D] with one scale per group of 32 keys (:func:`k_group_of_key`) per block of
    128 keys (SageAttention2's per-thread granularity): the scale folds into one multiplier per thread and row.

    amax over the group's valid keys (``j < kv_lens[b]``) and channels; masked keys are quantized with their
    group's scale and clamped. Returns ``(k_hat int8 [B, H, N, D], scale per key [B, H, N, 1], group_scale
    [B, H, ceil(N / 128), 4])``.
    """
    x = k.float() if k.dtype != torch.float64 else k
    b, h, n, d = x.shape
    nb = -(-n // K_GROUP_BLOCK)
    valid = key_valid_mask(n, kv_lens, b, x.device).to(x.dtype)  # [B, 1, N, 1]
    a = (x.abs() * valid).amax(dim=-1)  # [B, H, N]
    a = torch.nn.functional.pad(a, (0, nb * K_GROUP_BLOCK - n))
    g_amax = a.view(b, h, nb, K_GROUP_BLOCK // 8, K_GROUPS, 2).amax(dim=(3, 5))  # [B, H, nb, 4]
    j = torch.arange(n, device=x.device)
    per_key = g_amax[:, :, j // K_GROUP_BLOCK, k_group_of_key(j)].unsqueeze(-1)  # [B, H, N, 1]
    k_hat, scale = _symmetric_quantize(x, per_key, INT8_QMAX)
    q = torch.full_like(g_amax, INT8_QMAX)
    g_scale = torch.where(g_amax == 0, torch.zeros_like(g_amax), g_amax / q)
    return k_hat, scale, g_scale


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


def quantize_v_per_group_int4(
    v: torch.Tensor, block_n: int, kv_lens: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-group INT4 of ``v`` [B, H, N, D]: one scale per channel per key block of ``block_n``.

    Keys ``j >= kv_lens[b]`` and the tail padding are zeroed before quantizing. Returns
    ``(v_hat, scale, colsum)``: ``v_hat`` int8 [B, H, N_pad, D] in [-7, 7], ``scale``
    [B, H, n_blocks, D], ``colsum`` int32 [B, H, n_blocks, D] = sum of ``v_hat`` over each block.
    """
    b, h, n, d = v.shape
    v = v.float() if v.dtype != torch.float64 else v
    v = v * key_valid_mask(n, kv_lens, b, v.device).to(v.dtype)
    v = pad_to_blocks(v, block_n)
    nb = v.shape[2] // block_n
    vb = v.view(b, h, nb, block_n, d)
    amax = vb.abs().amax(dim=3, keepdim=True)
    v_hat, scale = _symmetric_quantize(vb, amax, INT4_QMAX)
    colsum = v_hat.to(torch.int32).sum(dim=3)
    return v_hat.view(b, h, nb * block_n, d), scale.squeeze(3), colsum


def quant_p_range_int4(p: torch.Tensor) -> torch.Tensor:
    """Range-optimized P (paper Eq. 12): ``rint(15 p) - 8`` in [-8, 7] for p in [0, 1]."""
    return (torch.round(p * P_RANGE_SCALE) - P_RANGE_ZERO).clamp_(-8, 7).to(torch.int8)


def quant_p_sym_int4(p: torch.Tensor) -> torch.Tensor:
    """Symmetric P (paper Eq. 11, with rounding): ``rint(7 p)`` in [0, 7] for p in [0, 1]."""
    return torch.round(p * P_SYM_SCALE).clamp_(0, 7).to(torch.int8)


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


def round_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest FP4 e2m1 value {0, ±0.5, ±1, ±1.5, ±2, ±3, ±4, ±6}, ties to even mantissa."""
    a = x.abs().clamp(max=6.0)
    # Below 2 the grid step is 0.5, in [2, 4) it is 1, above it is 2; rint on the scaled value
    # gives ties-to-even on the mantissa bit in each binade.
    r = torch.where(a < 2.0, torch.round(a * 2) / 2, torch.where(a < 4.0, torch.round(a), torch.round(a / 2) * 2))
    return torch.copysign(r, x)


def quantize_nvfp4(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """NVFP4 emulation: blocks of 16 along ``dim``, e4m3 block scales, one fp32 tensor scale.

    Returns the dequantized tensor (same shape and float dtype as ``x``, padding removed).
    The tensor scale maps the largest block scale to the top of e4m3; block scale = amax/6
    rounded to e4m3; values rounded to e2m1 (ties to even).
    """
    x = x.float() if x.dtype != torch.float64 else x
    xt = x.movedim(dim, -1)
    n = xt.shape[-1]
    xt = pad_to_blocks(xt, NVFP4_BLOCK, dim=-1)
    blocks = xt.unflatten(-1, (-1, NVFP4_BLOCK))
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    tensor_amax = amax.amax()
    tensor_scale = tensor_amax / (6.0 * FP8_E4M3_MAX) if tensor_amax > 0 else torch.ones_like(tensor_amax)
    block_scale = round_to_fp8_e4m3(amax / 6.0 / tensor_scale) * tensor_scale
    safe = torch.where(block_scale == 0, torch.ones_like(block_scale), block_scale)
    q = round_to_e2m1(blocks / safe) * block_scale
    return q.flatten(-2)[..., :n].movedim(-1, dim)
