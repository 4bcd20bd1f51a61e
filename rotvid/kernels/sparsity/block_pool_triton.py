"""One-pass GPU kernel (Triton) for the top-p builder's pooling: per (batch, head, 128-token block) the block mean
and the block's self-similarity, reading Q or K once in its own dtype and strides.

For block ``t`` of ``x[b, h]`` with valid tokens ``V = {n in [128 t, 128 t + 128) : n < min(N, kv_lens[b])}``
(``kv_lens`` absent: ``n < N``), ``c = |V|``:

- ``mean[b, h, t] = sum_{n in V} x[b, h, n] / max(c, 1)`` (0 for an empty block),
- ``sim[b, h, t] = sum_{n in V} cos(x[b, h, n], mean[b, h, t]) / max(c, 1)`` with
  ``cos(u, v) = u·v / max(|u| |v|, 1e-12)`` (0 for an empty block),

in float32 -- the maths of :func:`rotvid.kernels.sparsity.topp._pool`. The eager form materializes float32 copies of
the whole tensor (cast, padding, the weighted products, the norms); this kernel loads each block once (tokens outside
``V`` are not read: they count as 0), keeps it in registers, and writes ``D + 1`` floats per block. The sums run in
another order than PyTorch's reductions, so the results differ from the eager form's by float32 rounding (a few ulp
of the block's magnitude), nothing else.

Programs: one per (block, head, batch row), the block fastest, so neighbouring programs read neighbouring memory in
the BHND layout. Registered as the custom op ``rotvid::block_pool`` (:func:`torch.library.triton_op`): its fake form
comes from the op itself, and ``torch.compile(fullgraph=True)`` traces into the kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rotvid.kernels.sparsity.block_map import MAP_BLOCK, blocks_for

__all__ = ["POOL_DTYPES", "block_pool_triton"]

# The input dtypes the kernel reads (it computes in float32; float64 stays on the eager form).
POOL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_EPS = 1e-12


@triton.jit
def _block_pool_kernel(
    x_ptr, lens_ptr, mean_ptr, sim_ptr,
    N,
    sxb, sxh, sxn, sxd,
    smb, smh, smt,
    ssb, ssh,
    HAS_LENS: tl.constexpr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK: tl.constexpr,
    EPS: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    n = t * BLOCK + tl.arange(0, BLOCK)
    c = tl.arange(0, BLOCK_D)
    limit = N
    if HAS_LENS:
        limit = tl.minimum(tl.load(lens_ptr + b).to(tl.int32), N)
    valid = n < limit
    cmask = c < D
    src = x_ptr + b.to(tl.int64) * sxb + h.to(tl.int64) * sxh + n[:, None].to(tl.int64) * sxn + c[None, :] * sxd
    x = tl.load(src, mask=valid[:, None] & cmask[None, :], other=0.0).to(tl.float32)
    count = tl.maximum(tl.sum(valid.to(tl.float32), axis=0), 1.0)
    mean = tl.sum(x, axis=0) / count  # [BLOCK_D]
    dot = tl.sum(x * mean[None, :], axis=1)  # [BLOCK]
    x_norm = tl.sqrt(tl.sum(x * x, axis=1))
    mean_norm = tl.sqrt(tl.sum(mean * mean, axis=0))
    cos = dot / tl.maximum(x_norm * mean_norm, EPS)
    sim = tl.sum(tl.where(valid, cos, 0.0), axis=0) / count
    tl.store(mean_ptr + b.to(tl.int64) * smb + h * smh + t * smt + c, mean, mask=cmask)
    tl.store(sim_ptr + b * ssb + h * ssh + t, sim)


@torch.library.triton_op("rotvid::block_pool", mutates_args=())
def _block_pool_op(x: torch.Tensor, kv_lens: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    b, h, n, d = x.shape
    t = blocks_for(n)
    mean = torch.empty((b, h, t, d), dtype=torch.float32, device=x.device)
    sim = torch.empty((b, h, t), dtype=torch.float32, device=x.device)
    block_d = triton.next_power_of_2(d)
    # the block lives in registers: 128 x BLOCK_D float32, 64 per thread at D = 128
    num_warps = 4 if block_d <= 64 else 8 if block_d <= 128 else 16
    torch.library.wrap_triton(_block_pool_kernel)[(t, h, b)](
        x, x if kv_lens is None else kv_lens, mean, sim,
        n,
        x.stride(0), x.stride(1), x.stride(2), x.stride(3),
        mean.stride(0), mean.stride(1), mean.stride(2),
        sim.stride(0), sim.stride(1),
        HAS_LENS=kv_lens is not None, D=d, BLOCK_D=block_d, BLOCK=MAP_BLOCK, EPS=_EPS, num_warps=num_warps,
    )
    return mean, sim


def block_pool_triton(x: torch.Tensor, kv_lens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Block means float32 [B, H, T, D] and self-similarity float32 [B, H, T] of ``x`` [B, H, N, D] (module
    docstring), ``T = ceil(N / 128)``.

    Args:
        x: fp16 / bf16 / fp32 [B, H, N, D], any strides (a BNHD tensor passes as its [B, H, N, D] view, no copy).
        kv_lens: optional integer [B] on x's device: tokens ``n >= kv_lens[b]`` do not count (keys); None: all
            ``N`` tokens count (queries).
    """
    if x.dim() != 4:
        raise ValueError(f"x: expected [B, H, N, D], got shape {tuple(x.shape)}")
    if x.dtype not in POOL_DTYPES:
        raise ValueError(f"x: expected float16, bfloat16 or float32, got {x.dtype}")
    if kv_lens is not None:
        if kv_lens.dim() != 1 or kv_lens.shape[0] != x.shape[0] or kv_lens.dtype.is_floating_point:
            raise ValueError(f"kv_lens: expected an integer tensor of shape [{x.shape[0]}], got {kv_lens.dtype} "
                             f"{tuple(kv_lens.shape)}")
        if kv_lens.device != x.device:
            raise ValueError(f"kv_lens: on {kv_lens.device}, x on {x.device}")
    return _block_pool_op(x, kv_lens)
