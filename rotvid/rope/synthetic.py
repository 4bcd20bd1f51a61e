"""SYNTHETIC Q/K/V with the structure 3D RoPE gives real video-DiT activations.

These tensors are *synthetic*: made up from random numbers by the recipe below, not captured
from any model. They reproduce the structure RotateAttention reports (§3.1) from its stated
cause — per-channel biases and scales from the Q/K projections, then real 3D RoPE of a real
model family over a real (f, h, w) grid — so rotations can be compared on CPU without weights.
Conclusions drawn from them are about that structure, not about any model's activations; use
:mod:`rotvid.rope.dumps` for real ones.

Recipe, per head (all random draws from one ``torch.Generator`` seeded with ``seed``):

1. Token content z [N, r]: a smooth field over the token grid (random Fourier features of the
   (f, h, w) coordinates) plus i.i.d. noise, so nearby tokens are alike and attention has
   local structure.
2. Pre-RoPE Q = (z A_q) ⊙ s + μ_q and K = (z A_k) ⊙ s + μ_k, where A_k = ρ A_q + √(1-ρ²) A'
   (Q and K correlated, so attention is content-driven), ``s`` is ONE per-channel scale
   profile shared by Q and K (log-normal with a few heavy channels: what QK-norm weights and
   projections leave), and μ_q, μ_k are per-channel biases with the same magnitude profile
   (token-constant means, ``bias_scale`` times the content's size).
3. Real 3D RoPE of ``family`` on ``grid`` (:func:`rotvid.rope.tables.rope_table_3d`). A bias on
   a high-frequency pair turns into a position-dependent oscillation that mean smoothing cannot
   remove, while on a low-frequency pair it stays nearly constant and smoothing removes it:
   so Ψ concentrates in one half of each RoPE segment, and Q and K share their Ψ profile.
4. V = (z A_v) ⊙ s_v + μ_v with its own heavy-tailed channel profile, no RoPE.
5. Q and K are scaled together so that the scores q·k/√D have standard deviation
   ``score_std`` (attention neither uniform nor one-hot).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rotvid.rope.model_facts import get_rope_facts
from rotvid.rope.tables import apply_rope_interleaved, rope_table_3d

__all__ = ["SyntheticQKV", "synthetic_rope_qkv"]


@dataclass
class SyntheticQKV:
    """Synthetic post-RoPE Q, K and V (see the module docstring).

    Attributes:
        q, k, v: float32 [B, H, N, D] (BHND), N = f*h*w tokens frame-major; q and k have RoPE
            applied (what the attention kernel receives, before any rotation).
        family, grid, head_dim, segments, seed: how they were made.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    family: str
    grid: tuple[int, int, int]
    head_dim: int
    segments: tuple[int, int, int]
    seed: int


def _channel_profile(gen: torch.Generator, shape: tuple[int, ...], sigma: float, heavy_fraction: float, heavy_gain: float) -> torch.Tensor:
    prof = torch.exp(sigma * torch.randn(*shape, generator=gen, dtype=torch.float64))
    heavy = torch.rand(*shape, generator=gen, dtype=torch.float64) < heavy_fraction
    return prof * torch.where(heavy, heavy_gain, 1.0)


def synthetic_rope_qkv(
    family: str,
    grid: tuple[int, int, int],
    *,
    heads: int = 2,
    head_dim: int = 128,
    batch: int = 1,
    seed: int = 0,
    rank: int = 32,
    qk_correlation: float = 0.6,
    bias_scale: float = 4.0,
    heavy_fraction: float = 0.05,
    heavy_gain: float = 4.0,
    score_std: float = 2.5,
) -> SyntheticQKV:
    """Generate SYNTHETIC RoPE-structured Q/K/V (not model activations; see module docstring).

    Args:
        family: RoPE family (``"wan"``, ``"hunyuan_video"``, ``"cogvideox"``).
        grid: (f, h, w) token grid.
        heads, head_dim, batch: output shape [batch, heads, f*h*w, head_dim].
        seed: seeds every draw (same arguments -> same tensors).
        rank: dimension of the token content z.
        qk_correlation: ρ between the Q and K projections of the content.
        bias_scale: size of the per-channel biases relative to the content.
        heavy_fraction, heavy_gain: fraction of channels whose scale is multiplied by heavy_gain.
        score_std: target standard deviation of q·k/√D over all query/key pairs.

    Returns:
        :class:`SyntheticQKV` with float32 BHND tensors.
    """
    if not 0.0 <= qk_correlation <= 1.0:
        raise ValueError(f"qk_correlation must be in [0, 1], got {qk_correlation!r}")
    for name, value in (("heads", heads), ("batch", batch), ("rank", rank)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if score_std <= 0 or bias_scale < 0:
        raise ValueError(f"score_std must be > 0 and bias_scale >= 0, got {score_std!r}, {bias_scale!r}")
    segments = get_rope_facts(family).segments(head_dim)
    cos, sin = rope_table_3d(family, grid, head_dim)
    f, h, w = grid
    n = f * h * w
    gen = torch.Generator().manual_seed(int(seed))
    f64 = torch.float64

    # 1. token content: smooth field over the grid + noise.
    coords = torch.stack(
        torch.meshgrid(
            torch.arange(f, dtype=f64) / max(f, 1),
            torch.arange(h, dtype=f64) / max(h, 1),
            torch.arange(w, dtype=f64) / max(w, 1),
            indexing="ij",
        ),
        dim=-1,
    ).reshape(n, 3)
    omega = torch.randn(batch, 3, rank, generator=gen, dtype=f64) * 6.0
    phase = torch.rand(batch, 1, rank, generator=gen, dtype=f64) * 2 * math.pi
    smooth = math.sqrt(2.0) * torch.cos(coords @ omega + phase)  # [B, N, r]
    z = (smooth + torch.randn(batch, n, rank, generator=gen, dtype=f64)) / math.sqrt(2.0)

    # 2. projections with a shared per-channel profile and biases.
    a_q = torch.randn(heads, rank, head_dim, generator=gen, dtype=f64) / math.sqrt(rank)
    a_o = torch.randn(heads, rank, head_dim, generator=gen, dtype=f64) / math.sqrt(rank)
    a_k = qk_correlation * a_q + math.sqrt(1.0 - qk_correlation**2) * a_o
    a_v = torch.randn(heads, rank, head_dim, generator=gen, dtype=f64) / math.sqrt(rank)
    s = _channel_profile(gen, (heads, 1, head_dim), 0.5, heavy_fraction, heavy_gain)
    bias_mag = _channel_profile(gen, (heads, 1, head_dim), 0.5, heavy_fraction, heavy_gain)
    mu_q = bias_scale * bias_mag * torch.randn(heads, 1, head_dim, generator=gen, dtype=f64)
    mu_k = bias_scale * bias_mag * torch.randn(heads, 1, head_dim, generator=gen, dtype=f64)
    zh = z.unsqueeze(1)  # [B, 1, N, r]
    q = (zh @ a_q) * s + mu_q
    k = (zh @ a_k) * s + mu_k

    # 3. real 3D RoPE.
    q = apply_rope_interleaved(q, cos, sin)
    k = apply_rope_interleaved(k, cos, sin)

    # 4. values.
    s_v = _channel_profile(gen, (heads, 1, head_dim), 0.5, heavy_fraction, heavy_gain)
    mu_v = bias_scale * 0.5 * torch.randn(heads, 1, head_dim, generator=gen, dtype=f64)
    v = (zh @ a_v) * s_v + mu_v

    # 5. score temperature: scale Q and K by the same factor.
    probe = min(n, 256)
    scores = q[..., :probe, :] @ k[..., :probe, :].transpose(-1, -2) / math.sqrt(head_dim)
    factor = math.sqrt(score_std / float(scores.std()))
    q, k = q * factor, k * factor
    return SyntheticQKV(
        q=q.float(),
        k=k.float(),
        v=v.float(),
        family=family,
        grid=(f, h, w),
        head_dim=head_dim,
        segments=segments,
        seed=int(seed),
    )
