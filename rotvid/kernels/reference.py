"""PyTorch reference of every rotvid attention recipe: the steps they share and the contract of their kernels.

Everything is computed block by block over keys with the same online softmax the kernels use,
on any device. The INT4 recipe follows the contract below step by step (the CUDA kernels
implement the same steps; their tests feed both the *same* quantized inputs). This module holds the steps every
recipe shares (1, 3, 4 and 6, the walk over key blocks, block maps and the LSE); each recipe's own steps -- its
quantizers and P·V, its *reference twin* -- live in its folder of :mod:`rotvid.kernels.recipes`
(``recipes/<name>/reference.py``, beside its CUDA kernels).

Per (batch b, head h), with ``kv_len = kv_lens[b]`` (keys ``j >= kv_len`` are masked), all
arithmetic in float32 (float64 when the inputs are float64), ``rint`` = round half to even:

1. Smoothing. K (default on): ``k_s = k - mean_{j<kv_len}(k)`` (mean accumulated in float64,
   rounded once). Q (optional): ``q_s = q - mean(q)`` with one mean per head over all query rows
   (``q_block=None``, what the CUDA kernels do) or per block of ``q_block`` query rows, with the
   correction ``ΔS = mean(q)·k_sᵀ`` added to the scores (per head: one bias per key, which the
   kernels read like a key scale). V (optional):
   ``v_s = v - mean(v)``, the mean added to the output at the end (rows of P sum to 1).
2. Per-token INT4 of Q, K (:func:`rotvid.kernels.quantize.quantize_per_token_int4`); per-group INT4 of V, one
   scale per channel per key block of ``block_n``
   (:func:`rotvid.kernels.recipes.int4.reference.quantize_v_per_group_int4`), masked keys zeroed.
3. Scores in the log2 domain: ``s = (float(q̂·k̂) * (s_q * qk_scale)) * s_k`` with
   ``qk_scale = sm_scale * log2(e)``; masked keys get ``-inf``.
4. Per key block: ``m_blk = rowmax(s)``, ``p = exp2(s - m_blk)`` ∈ (0, 1] (row max 1, so the P
   scale is fixed).
5. P, as integers ``P̂`` ≥ 0 that stand for ``P̂ / L``: range-optimized ``P̂ = rint(15 p)`` ∈
   [0, 15] (``L = 15``; the INT4 operand is ``P̃ = P̂ - 8`` ∈ [-8, 7], and
   ``P̂·V̂ = P̃·V̂ + 8·colsum(V̂)``); symmetric ``P̂ = P̃ = rint(7 p)`` ∈ [0, 7] (``L = 7``).
   ``pv = float(P̂·V̂) * s_v`` and ``l_blk = float(rowsum(P̂))``: the row sum is taken from the
   *quantized* P (an exact integer), so the factor ``1 / L`` cancels in ``O / l`` and the output
   is a convex combination of the dequantized V rows. (Normalizing by the unquantized row sum
   instead loses 1.4-2.5 dB of SQNR with range P and 4-8 dB with symmetric P on the synthetic
   study: the keys whose p rounds to 0 no longer shrink the output.)
6. Online combine: ``m_new = max(m, m_blk)``, ``O = O·exp2(m - m_new) + exp2(m_blk - m_new)·pv``,
   ``l`` likewise; ``out = O / l (+ mean(v))``.

Each recipe's own numerics are in its folder of :mod:`rotvid.kernels.recipes`, built from the steps here
(:func:`attend_key_blocks`, :func:`attention_blockwise`; the INT4 recipes:
:func:`rotvid.kernels.recipes.int4.reference.attention_int4`); :func:`rotvid.kernels.recipes.attention_reference`
runs one by name. Other recipes share steps 1, 3, 4 and 6 (with ``l_blk = rowsum(p)`` of the unquantized p):
``fp16`` (no quantization), ``int8-fp8`` (SageAttention2-8b: INT8 Q per token and K per group of 32 keys per 128-key
block -- the keys one kernel thread holds --, P and V in FP8 e4m3 with V per channel and P scaled by 448, one FP32
buffer per key block; :mod:`rotvid.kernels.recipes.int8_fp8.reference`), ``int4-fp8`` (SageAttention2-4b: INT4
Q/K, FP8 P/V) and ``nvfp4`` (emulation: Q/K/P/V in e2m1 with 16-element e4m3 block scales; SageAttention3 /
Attn-QAT; :mod:`rotvid.kernels.recipes.nvfp4.reference`).

Block maps (:class:`~rotvid.kernels.sparsity.BlockMap`, ``block_map=`` of every function here that attends):
the key blocks a query tile skips are exactly blocks of ``-inf`` scores for its rows (masked after the scores, as
``kv_lens`` is), so the smoothing corrections, the per-block V scales and the row statistics ``m``, ``l`` stay exact
over the kept keys, and a skipped block leaves ``(m, l, O)`` as they were. Key blocks are visited in ascending order
whether a map is given or not, so a map of density 1 gives the dense call's bits. The map's blocks are 128 tokens;
a key block of ``block_n`` keys takes each key's map block (``key // 128``). A query row whose tile keeps no key
block (or none before ``kv_lens``) has ``l = 0``: its output is 0 (V's mean is not added there). A malformed
map means what it means to the kernels (:meth:`BlockMap.visit_counts`): counts clamped to ``[0, Kmax]``, entries
outside ``[0, Tk)`` skipped, an entry listed twice visited twice.

Log-sum-exp (``return_lse=True`` of every function here that attends; ring attention merges partial results with
it): per query row, ``lse = ln Σ_j exp(sm_scale · q·k_j)`` over the keys the row attends (before ``kv_lens``, in
the blocks its map keeps), natural log, of the *unsmoothed* scores -- flash-attention's ``softmax_lse``, what
diffusers' ring attention merges. From the online softmax's running ``(m, l)`` (log2 domain): ``lse = ln 2 · (m +
log2(l / L))`` with ``L`` the unit of ``l`` (1 for the recipes whose ``l`` is the row sum of the float ``p``; 15 /
7 for the INT4 recipes, whose ``l`` is the row sum of the integers ``P̂`` standing for ``P̂ / L``; 448 for the
int8-fp8 twin, whose ``l`` sums ``448 p``), so a chunk's weight ``exp(lse)`` is what that chunk's keys add to
the single-call ``l`` (times ``2^m``), and merging chunks by it repeats the single call's online combine.
**K smoothing** subtracts ``mean(k)`` over the call's valid keys from every key: that shifts every score of row
``i`` by ``-sm_scale · q_i·mean(k)``, which cancels inside one softmax but not between calls on different key
chunks (each has its own mean). The LSE adds the shift back (:func:`k_smoothing_lse_shift`, from the unsmoothed
``q`` -- Q smoothing's ΔS restores ``q·k_s`` exactly, so the shift is ``q·mean(k)`` with or without it): exact in
float arithmetic, and in a quantized recipe the merge weights carry only the quantization error of the smoothed
scores. Rows that attend no key (a map that keeps no block) have ``lse = -inf``. Shape: q's without the head
dim, in q's layout (``[B, H, N_q]`` for ``"BHND"``, ``[B, N_q, H]`` for ``"BNHD"``: diffusers' order), in the
compute dtype (float32; float64 for float64 inputs).

Non-finite inputs are not checked here: a NaN or Inf in a head's Q, K or V propagates to NaN
in (at least) the affected rows of that head's output, and other heads are unaffected.
"""

from __future__ import annotations

import math

import torch

from rotvid.kernels.quantize import key_valid_mask
from rotvid.kernels.sparsity.block_map import MAP_BLOCK, BlockMap

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

LAYOUTS = ("BHND", "BNHD")
DEFAULT_BLOCK_M = 128
DEFAULT_BLOCK_N = 64


def check_sm_scale(sm_scale) -> None:
    """ValueError unless ``sm_scale`` is None (D ** -0.5) or a finite number > 0: the kernels take each block's
    max before scaling, so a non-positive scale would be silently wrong there."""
    if sm_scale is not None and (isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float))
                                 or not math.isfinite(sm_scale) or sm_scale <= 0):
        raise ValueError(f"sm_scale: expected a finite number > 0 or None (D ** -0.5), got {sm_scale!r}")


def to_bhnd(x: torch.Tensor, layout: str) -> torch.Tensor:
    """View ``x`` in (B, H, N, D) order from the named layout."""
    return x if layout == "BHND" else x.transpose(1, 2)


def from_bhnd(x: torch.Tensor, layout: str) -> torch.Tensor:
    """Return ``x`` [B, H, N, D] in the named layout (contiguous)."""
    return (x if layout == "BHND" else x.transpose(1, 2)).contiguous()


def compute_dtype_for(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def masked_mean(x: torch.Tensor, kv_lens: torch.Tensor | None) -> torch.Tensor:
    """Mean of ``x`` [B, H, N, D] over valid tokens, accumulated in float64, in x's compute dtype."""
    b, _, n, _ = x.shape
    valid = key_valid_mask(n, kv_lens, b, x.device)
    x64 = x.double() * valid
    count = valid.sum(dim=2, keepdim=True).clamp_min(1).double()
    return (x64.sum(dim=2, keepdim=True) / count).to(compute_dtype_for(x))


def block_mean_rows(x: torch.Tensor, block_m: int) -> torch.Tensor:
    """For each row of ``x`` [B, H, N, D], the mean of its block of ``block_m`` rows (float64 accumulate)."""
    b, h, n, d = x.shape
    out = torch.empty(b, h, n, d, dtype=compute_dtype_for(x), device=x.device)
    for start in range(0, n, block_m):
        blk = x[:, :, start : start + block_m]
        out[:, :, start : start + block_m] = blk.double().mean(dim=2, keepdim=True).to(out.dtype)
    return out


def smooth_qkv(q, k, v, *, kv_lens, smooth_k, smooth_q, smooth_v, q_block=None):
    """Step 1 on (B, H, N, D) tensors: returns ``(q_s, k_s, v_s, q_block_mean, v_mean)`` in compute dtype.

    ``q_block``: query rows per Q mean (None: one mean per head over all query rows)."""
    dt = compute_dtype_for(q)
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    q_mean = v_mean = None
    if smooth_k:
        k = k - masked_mean(k, kv_lens)
    if smooth_q:
        q_mean = block_mean_rows(q, max(1, q.shape[2]) if q_block is None else q_block)
        q = q - q_mean
    if smooth_v:
        v_mean = masked_mean(v, kv_lens)
        v = v - v_mean
    return q, k, v, q_mean, v_mean


def int_matmul(a: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
    """Exact integer ``a @ b_tᵀ`` for small int8 values, via float64 (exact below 2^53)."""
    return torch.matmul(a.double(), b_t.double().transpose(-1, -2))


class _OnlineSoftmax:
    """Running (m, l, O) of the flash-attention recurrence, per query row."""

    def __init__(self, shape_o, dtype, device):
        b, h, n, d = shape_o
        self.m = torch.full((b, h, n, 1), -math.inf, dtype=dtype, device=device)
        self.l = torch.zeros((b, h, n, 1), dtype=dtype, device=device)
        self.o = torch.zeros(shape_o, dtype=dtype, device=device)

    @staticmethod
    def block_probs(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``m_blk``, ``p = exp2(s - m_blk)`` and ``l_blk``; rows with every key masked give p = 0."""
        m_blk = s.amax(dim=-1, keepdim=True)
        dead = torch.isneginf(m_blk)
        p = torch.exp2(s - torch.where(dead, torch.zeros_like(m_blk), m_blk))
        return m_blk, p, p.sum(dim=-1, keepdim=True)

    def update(self, m_blk, l_blk, pv):
        m_new = torch.maximum(self.m, m_blk)
        dead = torch.isneginf(m_new)
        m_ref = torch.where(dead, torch.zeros_like(m_new), m_new)
        a = torch.exp2(self.m - m_ref)
        c = torch.exp2(m_blk - m_ref)
        self.o = self.o * a + c * pv
        self.l = self.l * a + c * l_blk
        self.m = m_new

    def result(self, scale: torch.Tensor | None = None, mean: torch.Tensor | None = None) -> torch.Tensor:
        """``O / l`` (times ``scale``, plus ``mean`` when given: V's per-channel scale and mean); 0 in the rows that
        kept no key (``l = 0``: a block map skipped all their blocks; no V mean there either)."""
        out = self.o / self.l
        if scale is not None:
            out = out * scale
        if mean is not None:
            out = out + mean
        return out.masked_fill(self.l == 0, 0)

    def lse(self, unit: float = 1.0) -> torch.Tensor:
        """The natural-log log-sum-exp of each row's (log2-domain) scores, [B, H, N, 1]: ``ln 2 · (m + log2(l /
        unit))`` (``unit``: what one unit of ``l`` stands for, module docstring); ``-inf`` where ``l = 0``."""
        in_units = self.l / unit if unit != 1.0 else self.l
        lse = (self.m + torch.log2(in_units.clamp_min(torch.finfo(in_units.dtype).tiny))) * LN2
        return lse.masked_fill(self.l == 0, -math.inf)


def k_smoothing_lse_shift(q: torch.Tensor, k: torch.Tensor, kv_lens: torch.Tensor | None,
                          sm_scale: float) -> torch.Tensor:
    """What K smoothing took from the scores of each row, added back to its LSE (module docstring): ``sm_scale ·
    q·mean(k)`` [B, H, N_q, 1] in the compute dtype, with ``mean(k)`` over the valid keys exactly as smoothing
    takes it (:func:`masked_mean`) and ``q`` unsmoothed; q, k in (B, H, N, D) order."""
    dt = compute_dtype_for(q)
    return torch.matmul(q.to(dt), masked_mean(k, kv_lens).transpose(-1, -2)) * sm_scale


def lse_in_layout(lse: torch.Tensor, layout: str) -> torch.Tensor:
    """An LSE [B, H, N, 1] as the functions here return it: ``[B, H, N]`` (BHND) or ``[B, N, H]`` (BNHD),
    contiguous."""
    lse = lse.squeeze(-1)
    return (lse if layout == "BHND" else lse.transpose(1, 2)).contiguous()


def _map_tiles(block_map: BlockMap | None, device: torch.device) -> torch.Tensor | None:
    """How many times each query tile visits each key block, int32 [B', H', Tq, Tk] on ``device`` (None without a
    map; :meth:`BlockMap.visit_counts`: the clamped, range-checked map the kernels walk): built once per call, read
    by :func:`_score_mask` for every key block."""
    return None if block_map is None else block_map.visit_counts().to(device)


def _score_mask(s: torch.Tensor, start: int, kv_lens: torch.Tensor | None,
                tiles: torch.Tensor | None = None) -> torch.Tensor:
    """Scores ``s`` [B, H, Nq, n] of keys ``start .. start + n`` with ``-inf`` at keys ``j >= kv_lens[b]`` and in the
    key blocks the map skips for each row's query tile (``tiles``: :func:`_map_tiles`). A block a malformed map lists
    v > 1 times gets ``log2(v)`` added to its scores (log2 domain): the block's probabilities ``exp2(s - m_blk)``
    are unchanged and its weight in the row is v times one visit's, as in a kernel that visits it v times (a valid
    map lists a block at most once: nothing is added)."""
    j = torch.arange(start, start + s.shape[-1], device=s.device)
    if kv_lens is not None:
        valid = (j[None, :] < kv_lens.to(s.device)[:, None]).view(s.shape[0], 1, 1, -1)
        s = s.masked_fill(~valid, -math.inf)
    if tiles is not None:
        visits = tiles[..., j // MAP_BLOCK].repeat_interleave(MAP_BLOCK, dim=-2)[..., : s.shape[-2], :]  # [B',H',Nq,n]
        s = s.masked_fill(visits == 0, -math.inf)
        s = torch.where(visits > 1, s + torch.log2(visits.clamp(min=1).to(s.dtype)), s)
    return s


def log2_qk_scale(sm_scale: float, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(sm_scale * LOG2E, dtype=dtype)


def resolve_sm_scale(sm_scale: float | None, head_dim: int) -> float:
    """The score scale of a call: ``sm_scale``, or ``head_dim ** -0.5`` when None."""
    return head_dim**-0.5 if sm_scale is None else sm_scale


def int_scores(q_hat: torch.Tensor, sq: torch.Tensor, k_hat: torch.Tensor, k_scale: torch.Tensor,
                dtype: torch.dtype) -> torch.Tensor:
    """Step 3 on integer operands: ``(float(q̂·k̂) * sq) * s_kᵀ`` in ``dtype``, with ``sq = s_q * qk_scale``
    [B, H, Nq, 1] and one key block's ``k_hat`` and per-key ``k_scale`` [B, H, n, 1]."""
    return (int_matmul(q_hat, k_hat).to(dtype) * sq) * k_scale.transpose(-1, -2)


def q_smoothing_correction(q_mean: torch.Tensor, k_s: torch.Tensor, qk_scale: torch.Tensor) -> torch.Tensor:
    """Step 1's ``ΔS = mean(q)·k_sᵀ`` over one key block's smoothed keys ``k_s``, in the log2 domain (times
    ``qk_scale``)."""
    return torch.matmul(q_mean, k_s.transpose(-1, -2)) * qk_scale


def attend_key_blocks(block_scores, block_pv_sum, *, shape_o, dtype: torch.dtype, device: torch.device, n_kv: int,
                       block_n: int, kv_lens: torch.Tensor | None, block_map: BlockMap | None) -> _OnlineSoftmax:
    """Steps 3-6 over the key blocks of ``block_n`` keys, in ascending order: the walk every recipe shares.

    ``block_scores(start, stop)``: the log2-domain scores [B, H, Nq, stop - start] of keys ``start .. stop`` (step 3,
    ΔS included), masked here (keys past ``kv_lens``, blocks ``block_map`` skips); ``block_pv_sum(t, start, stop, p,
    l_blk) -> (pv, l_blk)``: key block ``t``'s P·V and row sum from its probabilities ``p = exp2(s - m_blk)`` and
    their row sum (steps 4-5). Returns the running ``(m, l, O)`` after the last block (step 6; its ``result`` is the
    output).
    """
    state = _OnlineSoftmax(shape_o, dtype, device)
    tiles = _map_tiles(block_map, device)
    for t, start in enumerate(range(0, n_kv, block_n)):
        stop = min(start + block_n, n_kv)
        s = _score_mask(block_scores(start, stop), start, kv_lens, tiles)
        m_blk, p, l_blk = state.block_probs(s)
        pv, l_blk = block_pv_sum(t, start, stop, p, l_blk)
        state.update(m_blk, l_blk, pv)
    return state


def attention_blockwise(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    operands,
    block_pv,
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
    """Steps 1, 3, 4 and 6 with a recipe's own operands and P·V: every recipe but the INT4 ones (``fp16``,
    ``int8-fp8``, ``int4-fp8``, ``nvfp4``, each in its module of :mod:`rotvid.kernels.recipes`).

    ``operands(q_s, k_s, v_s, valid, kv_lens) -> (qd, kd, vd, v_div)``: the smoothed (B, H, N, D) tensors in compute
    dtype as the recipe (de)quantizes them (``valid`` [B, 1, N_kv, 1] marks the keys before ``kv_lens``), and what
    ``block_pv`` needs besides (V's scale, or None). ``block_pv(p, vb, v_div) -> pv``: one key block's P·V from the
    block's probabilities ``p = exp2(s - m_blk)`` and V rows ``vb``; ``l_blk = rowsum(p)`` of the unquantized p.
    Output in q's shape, layout and dtype; ``block_m`` is the kernels' query tile (no effect on these numerics).
    ``block_map``: the key blocks each query tile visits (module docstring; None: all). ``return_lse``: ``(out,
    lse)``, the LSE of the unsmoothed scores (module docstring).
    """
    q, k, v = to_bhnd(q, layout), to_bhnd(k, layout), to_bhnd(v, layout)
    out_dtype = q.dtype
    b, h, nq, d = q.shape
    n_kv = k.shape[2]
    q_s, k_s, v_s, q_mean, v_mean = smooth_qkv(
        q, k, v, kv_lens=kv_lens, smooth_k=smooth_k, smooth_q=smooth_q, smooth_v=smooth_v, q_block=q_block
    )
    dt = q_s.dtype
    qk_scale = log2_qk_scale(resolve_sm_scale(sm_scale, d), dt).to(q.device)
    valid = key_valid_mask(n_kv, kv_lens, b, q.device)
    qd, kd, vd, v_div = operands(q_s, k_s, v_s, valid, kv_lens)

    def block_scores(start, stop):
        s = torch.matmul(qd, kd[:, :, start:stop].transpose(-1, -2)) * qk_scale
        if q_mean is not None:
            s = s + q_smoothing_correction(q_mean, k_s[:, :, start:stop], qk_scale)
        return s

    def block_pv_sum(t, start, stop, p, l_blk):
        return block_pv(p, vd[:, :, start:stop], v_div), l_blk

    state = attend_key_blocks(block_scores, block_pv_sum, shape_o=(b, h, nq, d), dtype=dt, device=q.device,
                               n_kv=n_kv, block_n=block_n, kv_lens=kv_lens, block_map=block_map)
    out = from_bhnd(state.result(mean=v_mean).to(out_dtype), layout)
    if not return_lse:
        return out
    lse = state.lse()
    if smooth_k:  # the scores were of k - mean(k): add the shift back (module docstring)
        lse = lse + k_smoothing_lse_shift(q, k, kv_lens, resolve_sm_scale(sm_scale, d))
    return out, lse_in_layout(lse, layout)


