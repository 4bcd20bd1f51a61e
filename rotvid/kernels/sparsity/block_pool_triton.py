"""One-pass GPU kernel (Triton) for the top-p builder's pooling: per (batch, head, 128-token block) the block mean
and the block's self-similarity, reading Q or K once in its own dtype and strides.

For block ``t`` of ``x[b, h]`` with valid tokens ``V = {n in [128 t, 128 t + 128) : n < min(N, kv_lens[b])}``
(``kv_lens`` absent: ``n < N``), ``c = |V|``:

- ``mean[b, h, t] = sum_{n in V} x[b, h, n] / max(c, 1)`` (0 for an empty block),
- ``sim[b, h, t] = sum_{n in V} cos(x[b, h, n], mean[b, h, t]) / max(c, 1)`` with
  ``cos(u, v) = u·v / max(|u| |v|, 1e-12)`` (0 for an empty block),

in float32 -- the maths of :func:`rotvid.kernels.sparsity.topp._pool`. The eager form materializes float32 copies of
the whole tensor (cast, padding, the weighted products, the norms); this kernel reads each block once, 32 tokens at a
time (tokens outside ``V`` are not read: they count as 0), and writes ``D + 1`` floats per block. One pass: the
similarity is taken as ``sum_n cos(x_n, m) = (sum_n x_n / |x_n|) · m / |m|`` (norms clamped at ``1e-12``), so a
chunk is summed twice (the tokens, the tokens over their norms) and never revisited. The sums run in another order
than PyTorch's reductions, so the results differ from the eager form's by float32 rounding (a few ulp of the
block's magnitude; the clamp differs only for norms below ``1e-12``), nothing else.

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
    CHUNK: tl.constexpr,
    EPS: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    c = tl.arange(0, BLOCK_D)
    cmask = c < D
    limit = N
    if HAS_LENS:
        limit = tl.minimum(tl.load(lens_ptr + b).to(tl.int32), N)
    base = x_ptr + b.to(tl.int64) * sxb + h.to(tl.int64) * sxh + c[None, :] * sxd
    total = tl.zeros([BLOCK_D], dtype=tl.float32)  # sum of the valid tokens
    unit = tl.zeros([BLOCK_D], dtype=tl.float32)  # sum of the valid tokens over their norms (0 for a zero token)
    for i in tl.static_range(BLOCK // CHUNK):
        n = t * BLOCK + i * CHUNK + tl.arange(0, CHUNK)
        valid = n < limit
        x = tl.load(base + n[:, None].to(tl.int64) * sxn, mask=valid[:, None] & cmask[None, :], other=0.0)
        x = x.to(tl.float32)
        total += tl.sum(x, axis=0)
        inv_norm = 1.0 / tl.maximum(tl.sqrt(tl.sum(x * x, axis=1)), EPS)
        unit += tl.sum(x * inv_norm[:, None], axis=0)
    count = tl.maximum(tl.minimum(limit - t * BLOCK, BLOCK), 0).to(tl.float32)
    mean = total / tl.maximum(count, 1.0)  # [BLOCK_D]
    mean_norm = tl.sqrt(tl.sum(mean * mean, axis=0))
    sim = tl.sum(unit * mean, axis=0) / tl.maximum(mean_norm, EPS) / tl.maximum(count, 1.0)
    tl.store(mean_ptr + b.to(tl.int64) * smb + h * smh + t * smt + c, mean, mask=cmask)
    tl.store(sim_ptr + b * ssb + h * ssh + t, sim)


@torch.library.triton_op("rotvid::block_pool", mutates_args=())
def _block_pool_op(x: torch.Tensor, kv_lens: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    b, h, n, d = x.shape
    t = blocks_for(n)
    mean = torch.empty((b, h, t, d), dtype=torch.float32, device=x.device)
    sim = torch.empty((b, h, t), dtype=torch.float32, device=x.device)
    block_d = triton.next_power_of_2(d)
    # a chunk of CHUNK tokens in registers at a time: 32 x BLOCK_D float32, 32 per thread at D = 128 with 4 warps
    chunk = 32 if block_d <= 128 else 16
    torch.library.wrap_triton(_block_pool_kernel)[(t, h, b)](
        x, x if kv_lens is None else kv_lens, mean, sim,
        n,
        x.stride(0), x.stride(1), x.stride(2), x.stride(3),
        mean.stride(0), mean.stride(1), mean.stride(2),
        sim.stride(0), sim.stride(1),
        HAS_LENS=kv_lens is not None, D=d, BLOCK_D=block_d, BLOCK=MAP_BLOCK, CHUNK=chunk, EPS=_EPS, num_warps=4,
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
