"""Attention statistics of a Wan transformer's self-attention: row entropy and spatio-temporal locality.

For each block's self-attention (``attn1``) on one forward pass, the softmax rows
``P = softmax(Q Kᵀ / √d)`` (Q, K after the block's RMS norm and Wan's 3-D RoPE, recomputed from
the module's own layers) are summarised over a subsample of query rows and all heads:

* ``entropy``: mean row entropy in nats, and ``entropy_ratio`` = entropy / ln N (1: uniform rows,
  0: one key per row);
* ``local_mass``: mean share of each row's mass on keys within a window of ``±window`` latent
  tokens in (frame, height, width) around the query; ``window_share`` is the share of all keys the
  window holds, so a row with no locality at all scores about ``window_share``;
* ``max_prob``: mean of each row's largest probability.

Learned attention is peaked (low entropy ratio) and local (local mass well above the window's
share); random weights give near-uniform rows.
"""

from __future__ import annotations

import math

import torch

__all__ = ["self_attention_statistics"]


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Wan's interleaved RoPE on ``x`` (B, N, H, D) with tables (1, N, 1, D)."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[..., 0::2], sin[..., 1::2]
    return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)


@torch.no_grad()
def self_attention_statistics(transformer, latents: torch.Tensor, timestep: torch.Tensor,
                              text: torch.Tensor, *, window: tuple[int, int, int] = (1, 2, 2),
                              max_queries: int = 512, seed: int = 0) -> list[dict]:
    """Per-block statistics of ``transformer``'s self-attention on one forward pass.

    Args:
        transformer: a ``WanTransformer3DModel`` (the Wan family's self-attention is ``blocks[i].attn1``).
        latents: ``(B, C, F, H, W)`` noisy latents; ``timestep``: ``(B,)``; ``text``: ``(B, L, D)``.
        window: half-widths (frames, rows, columns) of the local window, in patched latent tokens.
        max_queries: query rows sampled per block (seeded), all keys kept.

    Returns:
        One dict per block: ``block``, ``tokens``, ``entropy``, ``entropy_ratio``, ``local_mass``,
        ``window_share``, ``max_prob``.
    """
    if latents.ndim != 5:
        raise ValueError(f"latents: expected (B, C, F, H, W), got shape {tuple(latents.shape)}")
    pt, ph, pw = transformer.config.patch_size
    f, h, w = latents.shape[2] // pt, latents.shape[3] // ph, latents.shape[4] // pw
    n = f * h * w
    grid = torch.stack(torch.meshgrid(torch.arange(f), torch.arange(h), torch.arange(w), indexing="ij"),
                       -1).reshape(n, 3).to(latents.device)
    g = torch.Generator().manual_seed(seed)
    rows = torch.randperm(n, generator=g)[: min(max_queries, n)].to(latents.device)
    near = ((grid[rows, None, :] - grid[None, :, :]).abs() <= torch.tensor(window, device=latents.device)).all(-1)
    window_share = near.float().mean().item()
    captured: list[tuple[torch.Tensor, tuple]] = []
    hooks = []
    for block in transformer.blocks:
        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            rotary = args[3] if len(args) > 3 else kwargs.get("rotary_emb")
            captured.append((module, hidden, rotary))
        hooks.append(block.attn1.register_forward_pre_hook(hook, with_kwargs=True))
    stats = []
    try:
        captured.clear()
        transformer(hidden_states=latents, timestep=timestep, encoder_hidden_states=text, return_dict=False)
        for index, (attn, hidden, rotary) in enumerate(captured):
            q = attn.norm_q(attn.to_q(hidden)).unflatten(2, (attn.heads, -1)).float()
            k = attn.norm_k(attn.to_k(hidden)).unflatten(2, (attn.heads, -1)).float()
            if rotary is not None:
                cos, sin = (t.float() for t in rotary)
                q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            q = q[:, rows].transpose(1, 2)  # (B, H, R, D)
            k = k.transpose(1, 2)  # (B, H, N, D)
            p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
            ent = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
            stats.append({
                "block": index, "tokens": n, "entropy": ent.mean().item(),
                "entropy_ratio": ent.mean().item() / math.log(n),
                "local_mass": (p * near).sum(-1).mean().item(), "window_share": window_share,
                "max_prob": p.amax(-1).mean().item(),
            })
    finally:
        for hk in hooks:
            hk.remove()
    return stats
