"""Side-by-side attention kernel benchmark on one GPU: cuDNN SDPA (the baseline), SageAttention2-8b (the
peer, when importable: ``sageattn_qk_int8_pv_fp8_cuda_sm90``, its quantization included), rotvid INT4 (both
P modes) and, on sm90, rotvid int8-fp8 -- rotvid rows with pre-processing timed alone and included, each
recipe's default smoothing (Q, K and V for INT4, K for int8-fp8: rotvid.pipelines.config.SMOOTH_Q_BY_RECIPE and
SMOOTH_V_BY_RECIPE); an INT4 "Q not smoothed" kernel row shows what Q smoothing costs the kernel.

TOP/s = 4·B·H·N_q·N_kv·D / time (the usual attention count; masked keys still counted).
Times are medians of CUDA-event timings after warm-up. Inputs are bf16 random (never zeros), K with a
channel bias shared by all tokens (what K smoothing is for). Accuracy: cosine against float64 attention on
512 sampled query rows. A full run (every shape, the peer and cuDNN timed) also writes
``benchmarks/results/kernel_bench.json``
(``{"device", "commit", "date", "shapes": {SHAPE: {METHOD: {"tops", "vs_cudnn", "cos_fp64"}}}}``; a method that
was not timed keeps its entry with nulls and a ``note``); a partial run writes JSON only to ``--json-out``. The
commit is ``$ROTVID_COMMIT`` when set (set it on a machine whose git checkout may be stale), else ``git rev-parse``.

``--sparse`` (sm90) adds block-sparse attention at each density d of :data:`SPARSE_DENSITIES`: a random map per
head with the diagonal kept (each query tile keeps its diagonal block and ``round(d · Tk) - 1`` others, drawn
uniformly; the row ``density`` is the map's measured one), run by the int8-fp8 kernel (``rotvid-int8-fp8-sparse-dD``,
pre-processing included, and its kernel alone beside the dense kernel's time: the issue's bar is kernel time
<= (d + 0.05) x dense) and by FlexAttention (``flexattention-bf16-sparse-dD``: bf16, ``torch.compile``'d
``flex_attention`` with a ``BlockMask`` of the same map, its blocks given as full blocks). Their TOP/s count the dense
attention's operations (the speed a dense call would need to match); cos is against float64 attention under the map.
The cost of building a map at the shape: ``topp:0.9`` (GPU, ``torch.compile`` fullgraph, per call; its share of the
dense int8-fp8 call) and ``radial`` (CPU, uncached: once per resolution, then cached), each with its density. In the
JSON: the sparse and FlexAttention methods per shape (with ``density``; the rotvid rows also ``kernel_vs_dense`` and
``vs_flex``), and ``map_build`` per shape.

    python -m benchmarks.kernel_bench                     # all shapes, print the table
    python -m benchmarks.kernel_bench --shapes wan1.3b-480p --markdown-out section.md
    python -m benchmarks.kernel_bench --append benchmarks/RESULTS.md
    python -m benchmarks.kernel_bench --sparse --shapes wan1.3b-480p wan14b-720p --json-out sparse.json
    python -m benchmarks.kernel_bench --map-build-only --shapes wan1.3b-480p wan14b-720p   # the topp builder alone
    python -m benchmarks.kernel_bench --lse-cost --shapes wan1.3b-480p wan14b-720p cogvideox5b  # return_lse's cost

``--lse-cost`` (sm90) times the int8-fp8 call with and without ``return_lse`` (ring attention's log-sum-exp), the
kernel alone (the LSE store in its epilogue and the split combine) and the whole call (pre-processing included, and
K smoothing's shift added in torch), interleaved, and prints each one's cost as a share of the call without it (the
issue's bar: <= 1%); it writes no JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from rotvid.kernels.cuda_build import arch_entry
from rotvid.kernels.cuda_layout import SUPPORTED_BLOCK_N
from rotvid.kernels.recipes.int4.ops import (
    _resolve_path, attention_int4_quantized, default_block_n, int4_attention_cuda, preprocess_int4_cuda,
)
from rotvid.kernels.recipes.int8_fp8.ops import (
    attention_int8fp8_quantized, int8fp8_attention_cuda, preprocess_int8fp8_cuda,
)
from rotvid.kernels.sparsity import MAP_BLOCK, BlockMap, TokenGrid
from rotvid.kernels.sparsity.block_map import blocks_for
from rotvid.kernels.sparsity.radial import radial_block_mask
from rotvid.kernels.sparsity.topp import pmin_block_map, topp_block_map

from benchmarks.provenance import git_commit, utc_stamp
from benchmarks.timing import call_ms, kernel_us


@dataclass(frozen=True)
class Shape:
    name: str
    b: int
    h: int
    n: int
    d: int
    kv_len: int | None = None  # valid keys (HunyuanVideo pads its text keys)
    grid: TokenGrid | None = None  # the token grid after patchifying (the static map's input)


SHAPES = {
    s.name: s
    for s in (
        Shape("wan1.3b-480p", 1, 12, 32760, 128, grid=TokenGrid(21, 30, 52)),
        Shape("wan14b-480p", 1, 40, 32760, 128, grid=TokenGrid(21, 30, 52)),
        Shape("wan14b-720p", 1, 40, 75600, 128, grid=TokenGrid(21, 45, 80)),
        # 118800 video tokens + 256 text keys of which 136 are padding
        Shape("hunyuan-720p", 1, 24, 119056, 128, kv_len=118920, grid=TokenGrid(33, 45, 80, suffix=256)),
        Shape("cogvideox5b", 1, 48, 17776, 64, grid=TokenGrid(13, 30, 45, prefix=226)),
        # HunyuanVideo 1.5 (diffusers' HunyuanVideo15Transformer3DModel defaults, every released checkpoint: 16 heads
        # of 128, patch 1; VAE 16x spatial, 4x temporal), 121 frames -> 31 latent frames, at the pipeline's default
        # 480p (480x848 for target_size 640) and 720p (720x1280): video tokens + 1985 text keys (729 image + 256
        # ByT5 + 1000 MLLM, valid ones first) of which 120 are valid (a 120-token prompt, as the hunyuan-720p row)
        Shape("hunyuan15-480p", 1, 16, 51275, 128, kv_len=49410, grid=TokenGrid(31, 30, 53, suffix=1985)),
        Shape("hunyuan15-720p", 1, 16, 113585, 128, kv_len=111720, grid=TokenGrid(31, 45, 80, suffix=1985)),
        # SkyReels-V2 14B (Wan2.1-14B architecture: 40 heads of 128, patch (1, 2, 2); Wan VAE 8x / 4x) at its 540P:
        # 544x960, 97 frames -> 25 x 34 x 60 video tokens, no text in the self-attention
        Shape("skyreels14b-540p", 1, 40, 51000, 128, grid=TokenGrid(25, 34, 60)),
    )
}
SPARSE_DENSITIES = (0.2, 0.35, 0.5, 0.75)
TOPP_SPEC_TAU = 0.9  # the dynamic map whose building is timed
PMIN_SPEC_P = 0.002  # the one-threshold kind on the same estimate (no sort), timed beside it


def random_block_map(heads: int, n: int, density: float, seed: int, device) -> BlockMap:
    """A random map per head with the diagonal kept: each query tile keeps its diagonal block and
    ``round(density · Tk) - 1`` other key blocks drawn uniformly ([1, heads, Tq, Tk], self-attention over n tokens)."""
    t = blocks_for(n)
    keep = max(1, round(density * t))
    gen = torch.Generator().manual_seed(seed)
    draw = torch.rand(1, heads, t, t, generator=gen)
    draw[..., torch.arange(t), torch.arange(t)] = -1.0  # the diagonal ranks first
    rank = draw.argsort(dim=-1).argsort(dim=-1)
    return BlockMap.from_mask((rank < keep).to(device), n_q=n, n_kv=n)


def flex_block_mask(bm: BlockMap):
    """FlexAttention's ``BlockMask`` of the same map: every kept block a full block (no mask_mod evaluated), blocks
    of 128 queries and keys, the map's batch / head broadcast kept."""
    from torch.nn.attention.flex_attention import BlockMask

    idx = bm.indices
    if idx.shape[-1] < bm.kv_blocks:  # (flex wants one slot per key block)
        idx = torch.cat([idx, idx[..., :1].expand(*idx.shape[:-1], bm.kv_blocks - idx.shape[-1])], dim=-1)
    idx = idx.contiguous()
    return BlockMask.from_kv_blocks(torch.zeros_like(bm.counts), torch.zeros_like(idx), bm.counts.contiguous(), idx,
                                    BLOCK_SIZE=MAP_BLOCK, seq_lengths=(bm.n_q, bm.n_kv))


_FLEX = None


def compiled_flex():
    """``torch.compile(flex_attention)``, compiled once per process."""
    global _FLEX
    if _FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention

        _FLEX = torch.compile(flex_attention, dynamic=False)
    return _FLEX


def map_token_mask(bm: BlockMap, head: int, rows: torch.Tensor, n_kv: int) -> torch.Tensor:
    """bool [len(rows), n_kv]: the keys the map lets query rows ``rows`` of head ``head`` see."""
    dense = bm.to_dense_mask()[0, head if bm.counts.shape[1] > 1 else 0]  # [Tq, Tk]
    return dense[rows // MAP_BLOCK].repeat_interleave(MAP_BLOCK, dim=-1)[:, :n_kv]


def time_ms(fn, *, min_reps=3, budget_ms=1500.0) -> float:
    """Median per-call GPU time of ``fn()`` in ms (warm-up first; reps sized to a time budget).

    Each call sits between its own pair of CUDA events, and the CPU runs ahead (one synchronisation
    after the last call), as in a pipeline: launch and Python overhead hide behind the GPU work unless
    the CPU side is the slower one, in which case the gaps show up in the times.
    """
    fn()
    torch.cuda.synchronize()
    first = call_ms(fn, "cuda")
    reps = max(min_reps, min(50, int(budget_ms / max(first, 1e-3))))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in events:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return float((a @ b) / (a.norm() * b.norm()))


def cos_fp64_rows(out: torch.Tensor, q, k, v, rows: torch.Tensor, kv_len: int | None,
                  block_map: BlockMap | None = None) -> float:
    """Cosine of ``out`` [B, H, N, D] against float64 attention (under ``block_map`` when given) on the query rows
    ``rows``."""
    num = den_a = den_b = 0.0
    n_kv = k.shape[2] if kv_len is None else kv_len
    for hh in range(q.shape[1]):
        qs = q[:, hh, rows].double()
        s = qs @ k[:, hh, :n_kv].double().transpose(-1, -2) * q.shape[-1] ** -0.5
        if block_map is not None:  # (the diagonal is kept: no row is left without keys)
            s = s.masked_fill(~map_token_mask(block_map, hh, rows, k.shape[2])[:, :n_kv], float("-inf"))
        truth = torch.softmax(s, dim=-1) @ v[:, hh, :n_kv].double()
        got = out[:, hh, rows].double()
        num += float((truth * got).sum())
        den_a += float((truth * truth).sum())
        den_b += float((got * got).sum())
    return num / (den_a * den_b) ** 0.5


def time_interleaved(fns: dict, rounds: int, budget_ms: float = 1500.0) -> dict[str, float]:
    """Per-call GPU time of every method of a shape, in interleaved rounds.

    ``fns`` maps a key to ``fn`` or ``(fn, min_reps, budget_ms)``. Each round times every method once
    (:func:`time_ms` with its budget split over the rounds), the order rotating by one per round, so a drift of the
    GPU's clock over the shape's run (warming up, throttling) reaches every method alike instead of whichever ran
    last; a method's time is the median of its per-round medians.
    """
    if rounds < 1:
        raise ValueError(f"rounds: expected at least 1, got {rounds}")
    keys = list(fns)
    per: dict[str, list[float]] = {key: [] for key in keys}
    for r in range(rounds):
        shift = r % len(keys) if keys else 0
        for key in keys[shift:] + keys[:shift]:
            fn, min_reps, budget = fns[key] if isinstance(fns[key], tuple) else (fns[key], 3, budget_ms)
            per[key].append(time_ms(fn, min_reps=min_reps, budget_ms=budget / rounds))
    return {key: statistics.median(v) for key, v in per.items()}


def _under(backend, fn):
    """``fn`` run inside ``sdpa_kernel(backend)`` (the choice holds for that call only)."""
    def run():
        with sdpa_kernel(backend):
            return fn()
    return run


def bench_shape(shape: Shape, block_n: int, with_sage: bool, rotvid_only: bool = False, also_s8: bool = False,
                with_flash: bool = False, rounds: int = 3, sparse: bool = False) -> list[dict]:
    torch.manual_seed(0)
    b, h, n, d = shape.b, shape.h, shape.n, shape.d
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    k += torch.randn(1, h, 1, d, device="cuda", dtype=torch.bfloat16)  # a channel bias shared by the tokens
    flops = 4.0 * b * h * n * n * d
    kv_lens = None if shape.kv_len is None else torch.full((b,), shape.kv_len, dtype=torch.int32, device="cuda")
    rows_idx = torch.randperm(n, device="cuda")[:512].sort().values
    masked_note = "unmasked (cos vs unmasked float64)" if kv_lens is not None else ""
    # 1. every method as a closure (operands prepared now), 2. timed together in interleaved rounds, 3. rows in
    # the table's order, each output computed once more for its cosine against float64
    timers: dict = {}
    # (method, timer key, output fn or None, note or a callable of the times[, the block map of a sparse row])
    plan: list[tuple] = []

    cudnn = _under(SDPBackend.CUDNN_ATTENTION, lambda: F.scaled_dot_product_attention(q, k, v))
    timers["cudnn"] = (cudnn, 1, 1.0) if rotvid_only else cudnn
    plan.append(("sdpa-cudnn", "cudnn", cudnn, masked_note))
    if with_flash and not rotvid_only:
        flash = _under(SDPBackend.FLASH_ATTENTION, lambda: F.scaled_dot_product_attention(q, k, v))
        timers["flash"] = flash
        plan.append(("sdpa-flash", "flash", flash, masked_note))
    sage_missing = None
    if with_sage and not rotvid_only:
        try:
            from sageattention import sageattn_qk_int8_pv_fp8_cuda_sm90
        except ImportError as err:
            sage_missing = f"not importable: {err}"[:60]
        else:
            sage = lambda: sageattn_qk_int8_pv_fp8_cuda_sm90(  # noqa: E731
                q, k, v, tensor_layout="HND", qk_quant_gran="per_thread", pv_accum_dtype="fp32+fp32")
            timers["sage"] = sage
            plan.append(("sageattention2-8b", "sage", sage, masked_note))

    timers["pre4"] = lambda: preprocess_int4_cuda(
        q, k, v, kv_lens=kv_lens, block_n=block_n, smooth_v=True, smooth_q=True)
    kernel = _resolve_path("auto", q.device)
    if also_s8 and kernel == "wgmma":
        qkv_s8 = preprocess_int4_cuda(q, k, v, kv_lens=kv_lens, block_n=64, path="s8")
        timers["int4-s8"] = lambda: attention_int4_quantized(
            qkv_s8, n_q=n, n_kv=n, head_dim=d, block_n=64, kv_lens=kv_lens, out_dtype=q.dtype, path="s8")
        plan.append(("rotvid-int4 [s8 mma.sync, bn64] (attn only)", "int4-s8", None, ""))
    for p_mode, label in (("range", "rotvid-int4"), ("sym", "rotvid-int4-sym-p")):
        if p_mode == "range":  # the kernel without Q smoothing's bias per key: its cost, same operands otherwise
            qkv_nq = preprocess_int4_cuda(q, k, v, kv_lens=kv_lens, block_n=block_n, smooth_v=True)
            timers["int4-noq"] = lambda qkv=qkv_nq, pm=p_mode: attention_int4_quantized(
                qkv, n_q=n, n_kv=n, head_dim=d, block_n=block_n, kv_lens=kv_lens, p_mode=pm, out_dtype=q.dtype)
            plan.append((f"{label} [{kernel}] (attn only, Q not smoothed)", "int4-noq", None, ""))
        qkv4 = preprocess_int4_cuda(q, k, v, kv_lens=kv_lens, block_n=block_n, p_mode=p_mode,
                                    smooth_v=True, smooth_q=True)
        timers[f"{label}-att"] = lambda qkv=qkv4, pm=p_mode: attention_int4_quantized(
            qkv, n_q=n, n_kv=n, head_dim=d, block_n=block_n, kv_lens=kv_lens, p_mode=pm, out_dtype=q.dtype)
        full4 = lambda pm=p_mode: int4_attention_cuda(  # noqa: E731
            q, k, v, kv_lens=kv_lens, p_mode=pm, block_n=block_n, smooth_v=True, smooth_q=True)
        timers[f"{label}-full"] = full4
        plan.append((f"{label} [{kernel}] (attn only)", f"{label}-att", None, ""))
        plan.append((label, f"{label}-full", full4,
                     lambda t, a=f"{label}-att": f"[{kernel}] pre {t['pre4']:.2f} ms = {100 * t['pre4'] / t[a]:.1f}% of attn"))
    if arch_entry(q.device).wgmma:
        # the recipe's default smoothing: K only (SMOOTH_V_BY_RECIPE)
        pre8 = lambda: preprocess_int8fp8_cuda(q, k, v, kv_lens=kv_lens, smooth_v=False)  # noqa: E731
        timers["pre8"] = pre8
        qkv8 = pre8()
        timers["int8-whole"] = lambda: attention_int8fp8_quantized(
            qkv8, n_q=n, n_kv=n, head_dim=d, kv_lens=kv_lens, out_dtype=q.dtype, split_tail=False)
        timers["int8-att"] = lambda: attention_int8fp8_quantized(
            qkv8, n_q=n, n_kv=n, head_dim=d, kv_lens=kv_lens, out_dtype=q.dtype)
        full8 = lambda: int8fp8_attention_cuda(q, k, v, kv_lens=kv_lens, smooth_v=False)  # noqa: E731
        timers["int8-full"] = full8
        plan.append(("rotvid-int8-fp8 [wgmma] (attn only, no tail split)", "int8-whole", None, ""))
        plan.append(("rotvid-int8-fp8 [wgmma] (attn only)", "int8-att", None, ""))
        plan.append(("rotvid-int8-fp8", "int8-full", full8,
                     lambda t: f"[wgmma] pre {t['pre8']:.2f} ms = {100 * t['pre8'] / t['int8-att']:.1f}% of attn"))
        if sparse:
            plan_sparse(shape, q, k, v, kv_lens, qkv8, timers, plan)
    builds = map_builds(shape, q, k, timers) if sparse else {}

    times = time_interleaved(timers, rounds)
    rows = []
    for method, key, out_fn, note, *bm in plan:
        bm = bm[0] if bm else None
        ms = times[key]
        # (the methods that ran unmasked on a masked shape against the attention they computed: unmasked float64)
        kv_len = None if unmasked(method) else shape.kv_len
        cos = cos_fp64_rows(out_fn(), q, k, v, rows_idx, kv_len, bm) if out_fn is not None else None
        row = dict(shape=shape.name, method=method, ms=ms, tops=flops / ms / 1e9, cos=cos,
                   note=note(times) if callable(note) else note)
        if bm is not None:
            row["density"] = float(bm.density())
            if method.startswith("rotvid-int8-fp8-sparse-d") and key.endswith("-full"):
                row["kernel_vs_dense"] = times[key.replace("-full", "-att")] / times["int8-att"]
                row["vs_flex"] = times[key.replace("int8s", "flex").replace("-full", "")] / ms
        rows.append(row)
        if method == "sdpa-cudnn" and (sage_missing is not None or (not with_sage and not rotvid_only)):
            # the peer's row stays in the table and the JSON, with why it was not timed
            rows.append(dict(shape=shape.name, method="sageattention2-8b", ms=None, tops=None, cos=None,
                             note=sage_missing or "not timed (--no-sage)"))
    for spec, build in builds.items():
        ms = times[f"build-{spec}"] if build["on_gpu"] else build["ms"]
        rows.append(dict(shape=shape.name, method=f"map build {spec}", ms=ms, tops=None, cos=None,
                         density=build["density"], vs_dense_call=ms / times["int8-full"] if "int8-full" in times else None,
                         note=build["note"]))
    del q, k, v
    torch.cuda.empty_cache()
    return rows


def plan_sparse(shape: Shape, q, k, v, kv_lens, qkv8, timers: dict, plan: list) -> None:
    """The block-sparse rows of a shape (module docstring): per density, rotvid int8-fp8 with the map (kernel alone,
    and with its pre-processing) and FlexAttention with the same map."""
    h, n, d = shape.h, shape.n, shape.d
    flex = compiled_flex()
    for i, density in enumerate(SPARSE_DENSITIES):
        bm = random_block_map(h, n, density, seed=1000 + i, device=q.device)
        tag = f"d{density:g}"
        timers[f"int8s-{tag}-att"] = lambda bm=bm: attention_int8fp8_quantized(
            qkv8, n_q=n, n_kv=n, head_dim=d, kv_lens=kv_lens, out_dtype=q.dtype, block_map=bm)
        full = lambda bm=bm: int8fp8_attention_cuda(q, k, v, kv_lens=kv_lens, smooth_v=False,  # noqa: E731
                                                    block_map=bm)
        timers[f"int8s-{tag}-full"] = full
        mask = flex_block_mask(bm)
        flex_fn = lambda mask=mask: flex(q, k, v, block_mask=mask)  # noqa: E731
        timers[f"flex-{tag}"] = flex_fn
        bar = density + 0.05
        plan.append((f"rotvid-int8-fp8-sparse-{tag} [wgmma] (attn only)", f"int8s-{tag}-att", None,
                     lambda t, a=f"int8s-{tag}-att", bar=bar: f"{t[a] / t['int8-att']:.3f}x the dense kernel "
                     f"(bar <= {bar:.2f})", bm))
        plan.append((f"rotvid-int8-fp8-sparse-{tag}", f"int8s-{tag}-full", full,
                     lambda t, a=f"int8s-{tag}-full", f=f"flex-{tag}": f"{t[f] / t[a]:.2f}x FlexAttention", bm))
        plan.append((f"flexattention-bf16-sparse-{tag}", f"flex-{tag}", flex_fn, "torch.compile'd, full blocks", bm))


def map_builds(shape: Shape, q, k, timers: dict) -> dict:
    """The map builders timed at the shape: ``topp`` (GPU, compiled fullgraph; a timer) and ``radial`` (CPU,
    uncached, timed once here). Returns spec -> {on_gpu, ms (CPU builds), density, note}."""
    builds = {}

    def topp(q, k):
        out = topp_block_map(q, k, tau=TOPP_SPEC_TAU)
        return out.block_map.indices, out.block_map.counts

    def pmin(q, k):
        out = pmin_block_map(q, k, pmin=PMIN_SPEC_P)
        return out.block_map.indices, out.block_map.counts

    for spec, fn in ((f"topp:{TOPP_SPEC_TAU:g}", topp), (f"pmin:{PMIN_SPEC_P:g}", pmin)):
        compiled = torch.compile(fn, fullgraph=True)
        _, counts = compiled(q, k)
        timers[f"build-{spec}"] = lambda compiled=compiled: compiled(q, k)
        builds[spec] = dict(on_gpu=True, ms=None, density=float(counts.sum(dtype=torch.float64)) / counts.numel()
                            / blocks_for(shape.n), note="GPU, torch.compile fullgraph, per call")
    if shape.grid is not None and shape.grid.num_tokens == shape.n:
        start = time.perf_counter()
        mask = radial_block_mask(shape.grid)
        bm = BlockMap.from_mask(mask.to(q.device), n_q=shape.n, n_kv=shape.n)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - start) * 1e3
        builds["radial"] = dict(on_gpu=False, ms=ms, density=float(bm.density()),
                                note=f"CPU, once per resolution (cached after), grid {shape.grid}")
    return builds


def map_build_only(shape: Shape, rounds: int) -> list[str]:
    """``--map-build-only``: the ``topp`` and ``pmin`` builders at the shape (compiled fullgraph, as in ``map_build``)
    beside the dense int8-fp8 call they must stay within 3% of, and their pooling alone: the Triton kernel (Q and K) and
    the eager pooling compiled (what CPU tensors take). A build timed alone at a small shape is the host's time (each
    launch's Python and driver work, not the GPU's), so each build is also given as its kernels' GPU time
    (:func:`gpu_kernel_ms`) and as what it adds to the dense call when run before it, as a pipeline runs it (the host
    launches the build while the GPU still runs the previous call). Returns the table's lines."""
    from rotvid.kernels.sparsity.block_pool_triton import block_pool_triton
    from rotvid.kernels.sparsity.topp import _blocks, _pool

    torch.manual_seed(0)
    b, h, n, d = shape.b, shape.h, shape.n, shape.d
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    k += torch.randn(1, h, 1, d, device="cuda", dtype=torch.bfloat16)
    kv_lens = None if shape.kv_len is None else torch.full((b,), shape.kv_len, dtype=torch.int32, device="cuda")
    timers: dict = {}
    builds = map_builds(shape, q, k, timers)
    t = blocks_for(n)
    valid = (torch.arange(t * MAP_BLOCK, device="cuda") < n).view(1, 1, t, MAP_BLOCK)
    eager_pool = torch.compile(lambda x: _pool(_blocks(x.float(), t), valid), fullgraph=True)
    timers["pool-kernel"] = lambda: (block_pool_triton(q), block_pool_triton(k))
    timers["pool-eager"] = lambda: (eager_pool(q), eager_pool(k))
    def dense():
        return int8fp8_attention_cuda(q, k, v, kv_lens=kv_lens, smooth_v=False)

    timers["dense"] = dense
    spec, pspec = f"topp:{TOPP_SPEC_TAU:g}", f"pmin:{PMIN_SPEC_P:g}"
    builders = {s_: timers[f"build-{s_}"] for s_ in (spec, pspec)}
    for s_, build in builders.items():  # as a pipeline runs it: the build, then the call (its host time overlaps)
        timers[f"then-dense-{s_}"] = lambda build=build: (build(), dense())
    times = time_interleaved(timers, rounds)
    gpu = {s_: gpu_kernel_ms(build) for s_, build in builders.items()}
    lines = [f"{shape.name}: dense int8-fp8 call {times['dense']:.3f} ms ({torch.cuda.get_device_name()})"]
    for label, key in ((f"map build {spec} (density {builds[spec]['density']:.3f})", f"build-{spec}"),
                       (f"map build {pspec} (density {builds[pspec]['density']:.3f})", f"build-{pspec}"),
                       ("  pooling Q+K, Triton kernel", "pool-kernel"),
                       ("  pooling Q+K, eager form compiled", "pool-eager")):
        lines.append(f"  {label}: {times[key]:.3f} ms = {100 * times[key] / times['dense']:.2f}% of the dense call")
    for s_ in builders:
        added = times[f"then-dense-{s_}"] - times["dense"]
        lines.append(f"  {s_}: GPU kernels {gpu[s_]:.3f} ms = {100 * gpu[s_] / times['dense']:.2f}%; build + call "
                     f"{times[f'then-dense-{s_}']:.3f} ms, +{added:.3f} ms = {100 * added / times['dense']:+.2f}% "
                     "over the call alone")
    return lines


def gpu_kernel_ms(fn, iters: int = 20) -> float:
    """The GPU time of the kernels ``fn`` launches, per call, after one warm-up call (:func:`benchmarks.timing.kernel_us`
    summed): what a call costs the GPU when its host work overlaps the GPU's, as in a pipeline."""
    fn()
    torch.cuda.synchronize()
    return sum(kernel_us(fn, iters).values()) / 1e3


def lse_cost(shape: Shape, rounds: int) -> list[str]:
    """``--lse-cost``: the int8-fp8 call with and without ``return_lse`` at the shape (module docstring). Returns the
    table's lines."""
    torch.manual_seed(0)
    b, h, n, d = shape.b, shape.h, shape.n, shape.d
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    k += torch.randn(1, h, 1, d, device="cuda", dtype=torch.bfloat16)
    kv_lens = None if shape.kv_len is None else torch.full((b,), shape.kv_len, dtype=torch.int32, device="cuda")
    qkv8 = preprocess_int8fp8_cuda(q, k, v, kv_lens=kv_lens, smooth_v=False)
    att = dict(n_q=n, n_kv=n, head_dim=d, kv_lens=kv_lens, out_dtype=torch.bfloat16)
    timers = {
        "kernel": lambda: attention_int8fp8_quantized(qkv8, **att),
        "kernel+lse": lambda: attention_int8fp8_quantized(qkv8, return_lse=True, **att),
        "call": lambda: int8fp8_attention_cuda(q, k, v, kv_lens=kv_lens, smooth_v=False),
        "call+lse": lambda: int8fp8_attention_cuda(q, k, v, kv_lens=kv_lens, smooth_v=False, return_lse=True),
    }
    times = time_interleaved(timers, rounds)
    lines = [(f"{shape.name}: int8-fp8 with and without return_lse ({torch.cuda.get_device_name()}, commit "
              f"{git_commit()})")]
    for label, base, with_lse in (("kernel alone", "kernel", "kernel+lse"), ("whole call", "call", "call+lse")):
        cost = times[with_lse] / times[base] - 1
        lines.append(f"  {label}: {times[base]:.3f} ms, with the LSE {times[with_lse]:.3f} ms: {100 * cost:+.2f}%")
    return lines


UNMASKED_METHODS = ("sdpa-cudnn", "sdpa-flash", "sageattention2-8b")  # run without kv_lens (no masking API used)
JSON_METHODS = ("sdpa-cudnn", "sageattention2-8b", "rotvid-int4", "rotvid-int4-sym-p", "rotvid-int8-fp8")
# (the block-sparse methods of --sparse go in too: rotvid-int8-fp8-sparse-dD, flexattention-bf16-sparse-dD)
SPARSE_JSON_PREFIXES = ("rotvid-int8-fp8-sparse-d", "flexattention-bf16-sparse-d")


def unmasked(method: str) -> bool:
    """Methods that run without kv_lens (no masking API used): cos against the attention they computed."""
    return method in UNMASKED_METHODS or method.startswith("flexattention")


def json_method(method: str) -> bool:
    return method in JSON_METHODS or (method.startswith(SPARSE_JSON_PREFIXES) and " " not in method)


def results_json(rows: list[dict]) -> dict:
    """The machine-readable result: the methods of :data:`JSON_METHODS` and the block-sparse ones per shape
    (pre-processing included), and the map builds per shape (``map_build``) when timed."""
    base = {r["shape"]: r["ms"] for r in rows if r["method"] == "sdpa-cudnn"}
    shapes: dict = {}
    builds: dict = {}
    for r in rows:
        if r["method"].startswith("map build "):
            builds.setdefault(r["shape"], {})[r["method"][len("map build "):]] = {
                "ms": round(r["ms"], 3), "density": round(r["density"], 4),
                "vs_dense_call": None if r["vs_dense_call"] is None else round(r["vs_dense_call"], 4),
                "note": r["note"]}
            continue
        if not json_method(r["method"]):
            continue
        if r["ms"] is None:  # not timed (e.g. the peer not importable): kept, with why
            shapes.setdefault(r["shape"], {})[r["method"]] = {"tops": None, "vs_cudnn": None, "cos_fp64": None,
                                                              "note": r["note"]}
            continue
        entry = shapes.setdefault(r["shape"], {})[r["method"]] = {
            "tops": round(r["tops"], 1), "vs_cudnn": round(base[r["shape"]] / r["ms"], 4),
            "cos_fp64": None if r["cos"] is None else round(r["cos"], 6),
        }
        for extra in ("density", "kernel_vs_dense", "vs_flex"):
            if extra in r:
                entry[extra] = round(r[extra], 4)
    out = {
        "device": torch.cuda.get_device_name(),
        "commit": git_commit(),
        "date": utc_stamp(),
        "shapes": shapes,
    }
    if builds:
        out["map_build"] = builds
    return out


def markdown(rows: list[dict], block_n: int) -> str:
    dev = torch.cuda.get_device_name()
    lines = [
        f"### kernel_bench: {dev}, {utc_stamp()}, commit {git_commit()}",
        "",
        f"torch {torch.__version__}, CUDA {torch.version.cuda}; rotvid block_n={block_n}; bf16 random inputs; "
        "time = median over interleaved rounds (every method once per round, the order rotating) of each round's median; "
        "TOP/s = 4·B·H·N²·D / time; ratio = cuDNN time / method time (same run); cos = cosine vs float64 "
        "attention on 512 sampled query rows (a method that ran unmasked on a masked shape: against unmasked float64 "
        "attention, the attention it computed).",
        "",
        "| shape | method | ms | TOP/s | vs cuDNN | cos | note |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    base = {r["shape"]: r["ms"] for r in rows if r["method"] == "sdpa-cudnn"}
    for r in rows:
        if r["ms"] is None:
            lines.append(f"| {r['shape']} | {r['method']} | — | — | — | — | {r['note']} |")
            continue
        note = r["note"]
        if "density" in r:
            note = f"density {r['density']:.3f}" + (f"; {note}" if note else "")
        if r["tops"] is None:  # a map build: its time and share of the dense int8-fp8 call
            share = f"{100 * r['vs_dense_call']:.1f}% of the dense int8-fp8 call; " if r.get("vs_dense_call") else ""
            lines.append(f"| {r['shape']} | {r['method']} | {r['ms']:.2f} | — | — | | {share}{note} |")
            continue
        ratio = base[r["shape"]] / r["ms"]
        cos = f"{r['cos']:.5f}" if r["cos"] is not None else ""
        lines.append(f"| {r['shape']} | {r['method']} | {r['ms']:.2f} | {r['tops']:.0f} | {ratio:.2f}× | {cos} | {note} |")
    return "\n".join(lines) + "\n"


DEFAULT_JSON = Path(__file__).parent / "results" / "kernel_bench.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--block-n", type=int, default=None, choices=SUPPORTED_BLOCK_N,
                    help="rotvid key block (default: the backend's, 128 with the wgmma kernel on sm90, else 64)")
    ap.add_argument("--also-s8", action="store_true",
                    help="on sm90 also time the mma.sync s8 kernel at block_n 64 and the wgmma kernel without its tail split "
                         "(attention only), for comparison")
    ap.add_argument("--no-sage", action="store_true", help="skip SageAttention2-8b even if importable")
    ap.add_argument("--flash", action="store_true", help="also time SDPA's flash backend")
    ap.add_argument("--json-out", type=Path, default=None,
                    help="machine-readable result (default: benchmarks/results/kernel_bench.json, written only by a "
                         "full run: every shape, the peer and cuDNN timed; a partial run writes JSON only here)")
    ap.add_argument("--rotvid-only", action="store_true", help="time only rotvid (cuDNN once, for the ratio)")
    ap.add_argument("--markdown-out", type=Path, help="write the markdown section to this file")
    ap.add_argument("--append", type=Path, help="append the markdown section to this results file")
    ap.add_argument("--rows-json", type=Path, default=None,
                    help="also write every row of the table (method, ms, ...) to this JSON file (for A/B runs)")
    ap.add_argument("--sparse", action="store_true",
                    help="also time block-sparse attention (sm90): rotvid int8-fp8 and FlexAttention with the same "
                         f"random maps (diagonal kept) at densities {', '.join(map(str, SPARSE_DENSITIES))}, and the "
                         "map builders (topp, radial) at each shape")
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved timing rounds per shape (default 3; every method once per round, the order "
                         "rotating; a method's time is the median of its round medians)")
    ap.add_argument("--map-build-only", action="store_true",
                    help="time only the topp map builder (and its pooling) against the dense int8-fp8 call at each "
                         "shape; prints a short table, writes no JSON")
    ap.add_argument("--lse-cost", action="store_true",
                    help="time only the int8-fp8 call with and without return_lse (ring attention's log-sum-exp) at "
                         "each shape; prints a short table, writes no JSON")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("kernel_bench: needs a CUDA GPU (torch.cuda.is_available() is False)")
    if args.lse_cost:
        for name in args.shapes:
            print("\n".join(lse_cost(SHAPES[name], args.rounds)), flush=True)
        return
    if args.map_build_only:
        for name in args.shapes:
            print("\n".join(map_build_only(SHAPES[name], args.rounds)), flush=True)
        return
    rows = []
    if args.block_n is None:
        args.block_n = default_block_n()
    for name in args.shapes:
        rows += bench_shape(SHAPES[name], args.block_n, not args.no_sage, args.rotvid_only, args.also_s8, args.flash,
                            args.rounds, args.sparse)
        print(markdown([r for r in rows if r["shape"] == name], args.block_n).split("\n", 6)[-1], flush=True)
    md = markdown(rows, args.block_n)
    print(md)
    if args.markdown_out:
        args.markdown_out.write_text(md)
    if args.json_out is None:
        partial = set(args.shapes) != set(SHAPES) or args.rotvid_only or args.no_sage
        if partial:
            print(f"kernel_bench: partial run: {DEFAULT_JSON} left as it is (pass --json-out to write this run's JSON)")
        else:
            args.json_out = DEFAULT_JSON
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.json_out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(results_json(rows), indent=2) + "\n")
        tmp.replace(args.json_out)  # atomic: a reader never sees half a file
    if args.rows_json:
        args.rows_json.parent.mkdir(parents=True, exist_ok=True)
        args.rows_json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1) + "\n")
    if args.append:
        with args.append.open("a") as fh:
            fh.write("\n" + md)


if __name__ == "__main__":
    main()
