"""One-pass GPU kernel (Triton) for the generalized RoPE table: RoPE and the Q/K rotation together.

``out[b, h, n, c] = sum_t coef[n, c, t] * x[b, h, n, index[c, t]]`` — the op of
:func:`rotvid.rope.fused_table.apply_generalized_rope`; :func:`rotvid.kernels.rope_op.apply_generalized_rope` calls
this on CUDA tensors. The
eager PyTorch form materializes a gathered [B, H, N, D, 4] float32 tensor (about 1.6 GB for
Wan 480p); this kernel reads x once (the four gathered reads of a row hit L1), reads each tile
of the table once for all heads of a batch row, and writes the output once, computing in float32.

Programs: one per (tile of ``BLOCK_T`` tokens, batch row); each loops over the heads. A per-head
table ([H, N, D, 4]) is read inside the loop instead. On CUDA, ``apply_generalized_rope`` runs rotvid's CUDA kernel
first (one table for all heads, fp16 / bf16, head_dim 64 / 128); this kernel covers the rest.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _generalized_rope_kernel(
    x_ptr, out_ptr, coef_ptr, idx_ptr,
    N,
    sxb, sxh, sxn,
    sob, soh, son,
    H: tl.constexpr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    PER_HEAD: tl.constexpr,
):
    pid_t = tl.program_id(0)
    b = tl.program_id(1)
    t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.arange(0, BLOCK_D)
    tmask = t < N
    cmask = c < D
    mask = tmask[:, None] & cmask[None, :]
    i0 = tl.load(idx_ptr + c * 4 + 0, mask=cmask, other=0)
    i1 = tl.load(idx_ptr + c * 4 + 1, mask=cmask, other=0)
    i2 = tl.load(idx_ptr + c * 4 + 2, mask=cmask, other=0)
    i3 = tl.load(idx_ptr + c * 4 + 3, mask=cmask, other=0)
    cbase = (t[:, None] * D + c[None, :]) * 4
    if not PER_HEAD:
        c0 = tl.load(coef_ptr + cbase + 0, mask=mask, other=0.0)
        c1 = tl.load(coef_ptr + cbase + 1, mask=mask, other=0.0)
        c2 = tl.load(coef_ptr + cbase + 2, mask=mask, other=0.0)
        c3 = tl.load(coef_ptr + cbase + 3, mask=mask, other=0.0)
    for h in range(H):
        if PER_HEAD:
            hbase = h * N * D * 4
            c0 = tl.load(coef_ptr + hbase + cbase + 0, mask=mask, other=0.0)
            c1 = tl.load(coef_ptr + hbase + cbase + 1, mask=mask, other=0.0)
            c2 = tl.load(coef_ptr + hbase + cbase + 2, mask=mask, other=0.0)
            c3 = tl.load(coef_ptr + hbase + cbase + 3, mask=mask, other=0.0)
        row = x_ptr + b * sxb + h * sxh + t[:, None] * sxn
        acc = c0 * tl.load(row + i0[None, :], mask=mask, other=0.0).to(tl.float32)
        acc += c1 * tl.load(row + i1[None, :], mask=mask, other=0.0).to(tl.float32)
        acc += c2 * tl.load(row + i2[None, :], mask=mask, other=0.0).to(tl.float32)
        acc += c3 * tl.load(row + i3[None, :], mask=mask, other=0.0).to(tl.float32)
        dst = out_ptr + b * sob + h * soh + t[:, None] * son + c[None, :]
        tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _generalized_rope_head_kernel(
    x_ptr, out_ptr, coef_ptr, idx_ptr,
    N,
    sxb, sxh, sxn,
    sob, soh, son,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    PER_HEAD: tl.constexpr,
):
    # one program per (head, tile of BLOCK_T tokens, batch row), the head fastest: the programs of one token tile
    # run side by side and read its table tile from L2
    h = tl.program_id(0)
    pid_t = tl.program_id(1)
    b = tl.program_id(2)
    t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.arange(0, BLOCK_D)
    tmask = t < N
    cmask = c < D
    mask = tmask[:, None] & cmask[None, :]
    i0 = tl.load(idx_ptr + c * 4 + 0, mask=cmask, other=0)
    i1 = tl.load(idx_ptr + c * 4 + 1, mask=cmask, other=0)
    i2 = tl.load(idx_ptr + c * 4 + 2, mask=cmask, other=0)
    i3 = tl.load(idx_ptr + c * 4 + 3, mask=cmask, other=0)
    cbase = (t[:, None] * D + c[None, :]) * 4
    if PER_HEAD:
        cbase += h * N * D * 4
    row = x_ptr + b * sxb + h * sxh + t[:, None] * sxn
    x0 = tl.load(row + i0[None, :], mask=mask, other=0.0).to(tl.float32)
    x1 = tl.load(row + i1[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(row + i2[None, :], mask=mask, other=0.0).to(tl.float32)
    x3 = tl.load(row + i3[None, :], mask=mask, other=0.0).to(tl.float32)
    c0 = tl.load(coef_ptr + cbase + 0, mask=mask, other=0.0)
    c1 = tl.load(coef_ptr + cbase + 1, mask=mask, other=0.0)
    c2 = tl.load(coef_ptr + cbase + 2, mask=mask, other=0.0)
    c3 = tl.load(coef_ptr + cbase + 3, mask=mask, other=0.0)
    acc = c0 * x0
    acc += c1 * x1
    acc += c2 * x2
    acc += c3 * x3
    dst = out_ptr + b * sob + h * soh + t[:, None] * son + c[None, :]
    tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=mask)


def apply_generalized_rope_triton(x: torch.Tensor, coef: torch.Tensor, index: torch.Tensor, *, layout: str = "loop",
                                  block_t: int = 16, num_warps: int = 4) -> torch.Tensor:
    """The generalized RoPE op on x [B, H, N, D] (fp16 / bf16 / fp32), one pass.

    Args:
        x: [B, H, N, D]; any strides with a unit stride on D (else it is made contiguous).
        coef: float32 [N, D, 4] (shared by the heads) or [H, N, D, 4] (per head).
        index: integer [D, 4] source channels.
        layout, block_t, num_warps: the launch (a tuning aid, benchmarks/device/rope_tune.py): ``"loop"``, one
            program per tile of ``block_t`` tokens looping over the heads (the default, 16 tokens, 4 warps), or
            ``"head"``, one program per (head, tile). On an H100 the default was the fastest of those tried, and
            rotvid's CUDA kernel (rotvid.kernels.rope_op.generalized_rope_cuda), which
            ``apply_generalized_rope`` takes first where it can, runs 3-6x faster with the same bits.

    Returns:
        [B, H, N, D] in x's dtype, computed in float32.
    """
    if x.dim() != 4:
        raise ValueError(f"x: expected [B, H, N, D], got shape {tuple(x.shape)}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"x: expected float16, bfloat16 or float32, got {x.dtype}")
    b, h, n, d = x.shape
    per_head = coef.dim() == 4
    expected = (h, n, d, 4) if per_head else (n, d, 4)
    if tuple(coef.shape) != expected:
        raise ValueError(f"coef: expected shape {expected}, got {tuple(coef.shape)}")
    if tuple(index.shape) != (d, 4):
        raise ValueError(f"index: expected shape ({d}, 4), got {tuple(index.shape)}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    coef = coef.to(device=x.device, dtype=torch.float32).contiguous()
    index = index.to(device=x.device, dtype=torch.int32).contiguous()
    out = torch.empty((b, h, n, d), dtype=x.dtype, device=x.device)
    strides = (x.stride(0), x.stride(1), x.stride(2), out.stride(0), out.stride(1), out.stride(2))
    if layout == "loop":
        _generalized_rope_kernel[(triton.cdiv(n, block_t), b)](
            x, out, coef, index, n, *strides,
            H=h, D=d, BLOCK_D=triton.next_power_of_2(d), BLOCK_T=block_t, PER_HEAD=per_head, num_warps=num_warps,
        )
    elif layout == "head":
        _generalized_rope_head_kernel[(h, triton.cdiv(n, block_t), b)](
            x, out, coef, index, n, *strides,
            D=d, BLOCK_D=triton.next_power_of_2(d), BLOCK_T=block_t, PER_HEAD=per_head, num_warps=num_warps,
        )
    else:
        raise ValueError(f"layout: expected 'loop' or 'head', got {layout!r}")
    return out
