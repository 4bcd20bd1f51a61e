"""The INT4 recipes' reference twin (``int4``, ``int4-sym-p``): steps 2 and 5 of the contract in
:mod:`rotvid.kernels.reference` -- per-token INT4 Q and K, per-group INT4 V, P as the integers P̂ (range-optimized or
symmetric) whose row sum normalizes the output -- and the attention on those operands, the exact model of the INT4
CUDA kernels (:mod:`rotvid.kernels.recipes.int4.ops`; their tests feed both the *same* quantized operands).

Steps 1, 3, 4 and 6 (smoothing, the scores, the block probabilities, the online combine) are the shared ones of
:mod:`rotvid.kernels.reference`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rotvid.kernels.quantize import (
    INT4_QMAX,
    key_valid_mask,
    pad_to_blocks,
    quantize_per_token_int4,
    symmetric_quantize,
)
from rotvid.kernels.reference import (
    DEFAULT_BLOCK_M,
    DEFAULT_BLOCK_N,
    attend_key_blocks,
    from_bhnd,
    int_matmul,
    int_scores,
    k_smoothing_lse_shift,
    log2_qk_scale,
    lse_in_layout,
    q_smoothing_correction,
    resolve_sm_scale,
    smooth_qkv,
    to_bhnd,
)
from rotvid.kernels.sparsity.block_map import BlockMap

P_RANGE_SCALE = 15  # range-optimized P: round(15 p) - 8 in [-8, 7]
P_RANGE_ZERO = 8
P_SYM_SCALE = 7  # symmetric P (paper Eq. 11): round(7 p) in [0, 7]


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
    v_hat, scale = symmetric_quantize(vb, amax, INT4_QMAX)
    colsum = v_hat.to(torch.int32).sum(dim=3)
    return v_hat.view(b, h, nb * block_n, d), scale.squeeze(3), colsum


def quant_p_range_int4(p: torch.Tensor) -> torch.Tensor:
    """Range-optimized P (paper Eq. 12): ``rint(15 p) - 8`` in [-8, 7] for p in [0, 1]."""
    return (torch.round(p * P_RANGE_SCALE) - P_RANGE_ZERO).clamp_(-8, 7).to(torch.int8)


def quant_p_sym_int4(p: torch.Tensor) -> torch.Tensor:
    """Symmetric P (paper Eq. 11, with rounding): ``rint(7 p)`` in [0, 7] for p in [0, 1]."""
    return torch.round(p * P_SYM_SCALE).clamp_(0, 7).to(torch.int8)


@dataclass
class QuantizedQKV:
    """The INT4 recipe's pre-processed operands, all in (B, H, N, D) order.

    ``q_hat``/``k_hat`` int8 in [-7, 7] with per-token scales [B, H, N, 1]; ``v_hat`` int8
    [B, H, N_kv padded to block_n, D] with per-block-per-channel ``v_scale`` and int32
    ``v_colsum`` [B, H, n_blocks, D]. ``v_mean`` [B, H, 1, D] when V is smoothed.
    ``q_block_mean``/``k_smoothed`` are kept only for Q smoothing's ΔS correction.
    """

    q_hat: torch.Tensor
    q_scale: torch.Tensor
    k_hat: torch.Tensor
    k_scale: torch.Tensor
    v_hat: torch.Tensor
    v_scale: torch.Tensor
    v_colsum: torch.Tensor
    block_n: int
    kv_lens: torch.Tensor | None = None
    v_mean: torch.Tensor | None = None
    q_block_mean: torch.Tensor | None = None
    k_smoothed: torch.Tensor | None = None

    @property
    def head_dim(self) -> int:
        return self.q_hat.shape[-1]

    @property
    def n_kv(self) -> int:
        return self.k_hat.shape[2]


def preprocess_int4(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    layout: str = "BHND",
    kv_lens: torch.Tensor | None = None,
    block_m: int = DEFAULT_BLOCK_M,
    block_n: int = DEFAULT_BLOCK_N,
    smooth_k: bool = True,
    smooth_q: bool = False,
    smooth_v: bool = False,
    q_block: int | None = None,
) -> QuantizedQKV:
    """Steps 1-2 of the INT4 recipe: smoothing, per-token INT4 Q/K, per-group INT4 V."""
    q, k, v = (to_bhnd(t, layout) for t in (q, k, v))
    q_s, k_s, v_s, q_mean, v_mean = smooth_qkv(
        q, k, v, kv_lens=kv_lens, smooth_k=smooth_k, smooth_q=smooth_q, smooth_v=smooth_v, q_block=q_block
    )
    q_hat, q_scale = quantize_per_token_int4(q_s)
    k_hat, k_scale = quantize_per_token_int4(k_s)
    v_hat, v_scale, colsum = quantize_v_per_group_int4(v_s, block_n, kv_lens)
    return QuantizedQKV(
        q_hat=q_hat,
        q_scale=q_scale,
        k_hat=k_hat,
        k_scale=k_scale,
        v_hat=v_hat,
        v_scale=v_scale,
        v_colsum=colsum,
        block_n=block_n,
        kv_lens=kv_lens,
        v_mean=v_mean,
        q_block_mean=q_mean,
        k_smoothed=k_s if smooth_q else None,
    )


def attention_from_quantized(
    qkv: QuantizedQKV,
    *,
    p_mode: str = "range",
    sm_scale: float | None = None,
    out_dtype: torch.dtype = torch.float32,
    layout: str = "BHND",
    block_map: BlockMap | None = None,
    return_lse: bool = False,
    lse_shift: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Steps 3-6 of the INT4 recipe on pre-processed operands; returns the output in ``layout``. ``block_map``: the
    key blocks each query tile visits (module docstring; None: all). ``return_lse``: ``(out, lse)``, the LSE of the
    scores computed here (of the smoothed keys) plus ``lse_shift`` [B, H, N_q, 1] when given
    (:func:`k_smoothing_lse_shift`: then it is the LSE of the unsmoothed scores, module docstring)."""
    if p_mode not in ("range", "sym"):
        raise ValueError(f"p_mode must be 'range' or 'sym', got {p_mode!r}")
    dt = qkv.q_scale.dtype
    qk_scale = log2_qk_scale(resolve_sm_scale(sm_scale, qkv.head_dim), dt).to(qkv.q_scale.device)
    sq = qkv.q_scale * qk_scale  # [B, H, Nq, 1]

    def block_scores(start, stop):
        s = int_scores(qkv.q_hat, sq, qkv.k_hat[:, :, start:stop], qkv.k_scale[:, :, start:stop], dt)
        if qkv.q_block_mean is not None:
            s = s + q_smoothing_correction(qkv.q_block_mean, qkv.k_smoothed[:, :, start:stop], qk_scale)
        return s

    def block_pv_sum(t, start, stop, p, _):
        v_hat = qkv.v_hat[:, :, start:stop]
        if p_mode == "range":
            p_t = quant_p_range_int4(p)
            pv_int = int_matmul(p_t, v_hat.transpose(-1, -2)) + P_RANGE_ZERO * qkv.v_colsum[:, :, t : t + 1].double()
            p_hat_sum = p_t.double().sum(dim=-1, keepdim=True) + P_RANGE_ZERO * p_t.shape[-1]  # rowsum(P̃ + 8)
        else:
            p_t = quant_p_sym_int4(p)
            pv_int = int_matmul(p_t, v_hat.transpose(-1, -2))
            p_hat_sum = p_t.double().sum(dim=-1, keepdim=True)
        pv = pv_int.to(dt) * qkv.v_scale[:, :, t : t + 1]  # in units of 1/L, like l_blk
        return pv, p_hat_sum.to(dt)

    b, h, nq, d = qkv.q_hat.shape
    state = attend_key_blocks(block_scores, block_pv_sum, shape_o=(b, h, nq, d), dtype=dt, device=qkv.q_hat.device,
                               n_kv=qkv.n_kv, block_n=qkv.block_n, kv_lens=qkv.kv_lens, block_map=block_map)
    out = from_bhnd(state.result(mean=qkv.v_mean).to(out_dtype), layout)
    if not return_lse:
        return out
    lse = state.lse(P_RANGE_SCALE if p_mode == "range" else P_SYM_SCALE)  # l sums P̂, which stands for P̂ / L
    return out, lse_in_layout(lse if lse_shift is None else lse + lse_shift, layout)


def attention_int4(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    p_mode: str = "range",
    layout: str = "BHND",
    kv_lens: torch.Tensor | None = None,
    sm_scale: float | None = None,
    block_m: int = DEFAULT_BLOCK_M,
    block_n: int = DEFAULT_BLOCK_N,
    smooth_k: bool = True,
    smooth_q: bool = False,
    smooth_v: bool = False,
    q_block: int | None = None,
    block_map: BlockMap | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The INT4 recipes end to end (steps 1-6): ``p_mode`` ``"range"`` (``int4``) or ``"sym"`` (``int4-sym-p``).
    Output in q's shape, layout and dtype; ``block_map`` as :func:`attention_from_quantized`'s; ``return_lse``:
    ``(out, lse)``, the LSE of the unsmoothed scores (module docstring)."""
    qkv = preprocess_int4(
        q, k, v, layout=layout, kv_lens=kv_lens, block_m=block_m, block_n=block_n,
        smooth_k=smooth_k, smooth_q=smooth_q, smooth_v=smooth_v, q_block=q_block,
    )
    shift = None
    if return_lse and smooth_k:  # the scores are of k - mean(k): the LSE adds the shift back (module docstring)
        qb, kb = to_bhnd(q, layout), to_bhnd(k, layout)
        shift = k_smoothing_lse_shift(qb, kb, kv_lens, resolve_sm_scale(sm_scale, qb.shape[-1]))
    return attention_from_quantized(qkv, p_mode=p_mode, sm_scale=sm_scale, out_dtype=q.dtype, layout=layout,
                                    block_map=block_map, return_lse=return_lse, lse_shift=shift)
