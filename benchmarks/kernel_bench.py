"""Side-by-side attention kernel benchmark on one GPU: cuDNN / flash SDPA, sageattention 1.0.6
(if importable), rotvid INT4 (both P modes; pre-processing timed alone and included).

TOP/s = 4·B·H·N_q·N_kv·D / time (the usual attention count; masked keys still counted).
Times are medians of CUDA-event timings after warm-up. Inputs are random (never zeros).

    python benchmarks/kernel_bench.py                     # all shapes, print the table
    python benchmarks/kernel_bench.py --shapes wan1.3b-480p --markdown-out section.md
    python benchmarks/kernel_bench.py --append benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rotvid.kernels import cuda_backend  # noqa: E402


@dataclass(frozen=True)
class Shape:
    name: str
    b: int
    h: int
    n: int
    d: int
    kv_len: int | None = None  # valid keys (HunyuanVideo pads its text keys)


SHAPES = {
    s.name: s
    for s in (
        Shape("wan1.3b-480p", 1, 12, 32760, 128),
        Shape("wan14b-480p", 1, 40, 32760, 128),
        Shape("wan14b-720p", 1, 40, 75600, 128),
        # 118800 video tokens + 256 text keys of which 136 are padding
        Shape("hunyuan-720p", 1, 24, 119056, 128, kv_len=118920),
        Shape("cogvideox5b", 1, 48, 17776, 64),
    )
}


def time_ms(fn, *, min_reps=3, budget_ms=1500.0) -> float:
    """Median per-call GPU time of ``fn()`` in ms (warm-up first; reps sized to a time budget).

    Each call sits between its own pair of CUDA events, and the CPU runs ahead (one synchronisation
    after the last call), as in a pipeline: launch and Python overhead hide behind the GPU work unless
    the CPU side is the slower one, in which case the gaps show up in the times.
    """
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    first = start.elapsed_time(end)
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


def bench_shape(shape: Shape, block_n: int, with_sage: bool, rotvid_only: bool = False, also_s8: bool = False) -> list[dict]:
    torch.manual_seed(0)
    b, h, n, d = shape.b, shape.h, shape.n, shape.d
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = 4.0 * b * h * n * n * d
    kv_lens = None if shape.kv_len is None else torch.full((b,), shape.kv_len, dtype=torch.int32, device="cuda")
    rows = []

    def add(method, ms, out=None, ref=None, note=""):
        rows.append(dict(shape=shape.name, method=method, ms=ms, tops=flops / ms / 1e9,
                         cos=cosine(out, ref) if out is not None and ref is not None else None, note=note))

    ref = None
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        f = lambda: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
        ref = f()
        add("sdpa-cudnn", time_ms(f, min_reps=1 if rotvid_only else 3, budget_ms=1 if rotvid_only else 1500),
            note="unmasked" if kv_lens is not None else "")
    if not rotvid_only:
        try:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                f = lambda: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
                add("sdpa-flash", time_ms(f), f(), ref, note="unmasked" if kv_lens is not None else "")
        except RuntimeError as err:  # reported, not hidden
            rows.append(dict(shape=shape.name, method="sdpa-flash", ms=None, tops=None, cos=None, note=str(err)[:60]))
    if with_sage and not rotvid_only:
        try:
            from sageattention import sageattn

            f = lambda: sageattn(q, k, v, tensor_layout="HND", is_causal=False)  # noqa: E731
            add("sageattention-1.0.6", time_ms(f), f(), ref)
        except ImportError as err:
            rows.append(dict(shape=shape.name, method="sageattention", ms=None, tops=None, cos=None,
                             note=f"not importable: {err}"[:60]))

    pre = lambda: cuda_backend.preprocess_int4_cuda(q, k, v, kv_lens=kv_lens, block_n=block_n)  # noqa: E731
    pre_ms = time_ms(pre)
    kernel = cuda_backend._resolve_path("auto", q.device)
    if also_s8 and kernel == "wgmma":
        qkv = cuda_backend.preprocess_int4_cuda(q, k, v, kv_lens=kv_lens, block_n=64, path="s8")
        att = lambda: cuda_backend.attention_int4_quantized(  # noqa: E731
            qkv, n_q=n, n_kv=n, head_dim=d, block_n=64, kv_lens=kv_lens, out_dtype=q.dtype, path="s8")
        add("rotvid-int4 [s8 mma.sync, bn64] (attn only)", time_ms(att))
        qkv = cuda_backend.preprocess_int4_cuda(q, k, v, kv_lens=kv_lens, block_n=block_n)
        att = lambda: cuda_backend.attention_int4_quantized(  # noqa: E731
            qkv, n_q=n, n_kv=n, head_dim=d, block_n=block_n, kv_lens=kv_lens, out_dtype=q.dtype, split_tail=False)
        add("rotvid-int4 [wgmma, no tail split] (attn only)", time_ms(att))
    for p_mode, label in ((("range", f"rotvid-int4 [{kernel}]"), ("sym", f"rotvid-int4-sym-p [{kernel}]"))):
        qkv = cuda_backend.preprocess_int4_cuda(q, k, v, kv_lens=kv_lens, block_n=block_n, p_mode=p_mode)
        att = lambda: cuda_backend.attention_int4_quantized(  # noqa: E731
            qkv, n_q=n, n_kv=n, head_dim=d, block_n=block_n, kv_lens=kv_lens, p_mode=p_mode, out_dtype=q.dtype)
        full = lambda: cuda_backend.int4_attention_cuda(q, k, v, kv_lens=kv_lens, p_mode=p_mode, block_n=block_n)  # noqa: E731
        att_ms = time_ms(att)
        full_ms = time_ms(full)
        out = full()
        add(f"{label} (attn only)", att_ms)
        add(f"{label} (+pre)", full_ms, out if kv_lens is None else None, ref,
            note=f"pre {pre_ms:.2f} ms = {100 * pre_ms / att_ms:.1f}% of attn")
    del q, k, v, ref
    torch.cuda.empty_cache()
    return rows


def markdown(rows: list[dict], block_n: int) -> str:
    dev = torch.cuda.get_device_name()
    commit = os.environ.get("ROTVID_COMMIT") or _git_commit()
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"### kernel_bench: {dev}, {date}, commit {commit}",
        "",
        f"torch {torch.__version__}, CUDA {torch.version.cuda}; rotvid block_n={block_n}; bf16 random inputs; "
        "TOP/s = 4·B·H·N²·D / median time; ratio = cuDNN time / method time (same run); cos = cosine vs cuDNN output.",
        "",
        "| shape | method | ms | TOP/s | vs cuDNN | cos | note |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    base = {r["shape"]: r["ms"] for r in rows if r["method"] == "sdpa-cudnn"}
    for r in rows:
        if r["ms"] is None:
            lines.append(f"| {r['shape']} | {r['method']} | — | — | — | — | {r['note']} |")
            continue
        ratio = base[r["shape"]] / r["ms"]
        cos = f"{r['cos']:.5f}" if r["cos"] is not None else ""
        lines.append(f"| {r['shape']} | {r['method']} | {r['ms']:.2f} | {r['tops']:.0f} | {ratio:.2f}× | {cos} | {r['note']} |")
    return "\n".join(lines) + "\n"


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--block-n", type=int, default=None, choices=cuda_backend.SUPPORTED_BLOCK_N,
                    help="rotvid key block (default: the backend's, 128 with the wgmma kernel on sm90, else 64)")
    ap.add_argument("--also-s8", action="store_true",
                    help="on sm90 also time the mma.sync s8 kernel at block_n 64 and the wgmma kernel without its tail split "
                         "(attention only), for comparison")
    ap.add_argument("--no-sage", action="store_true", help="skip sageattention even if importable")
    ap.add_argument("--rotvid-only", action="store_true", help="time only rotvid (cuDNN once, for the ratio)")
    ap.add_argument("--markdown-out", type=Path, help="write the markdown section to this file")
    ap.add_argument("--append", type=Path, help="append the markdown section to this results file")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("kernel_bench: needs a CUDA GPU (torch.cuda.is_available() is False)")
    rows = []
    if args.block_n is None:
        args.block_n = cuda_backend.default_block_n()
    for name in args.shapes:
        rows += bench_shape(SHAPES[name], args.block_n, not args.no_sage, args.rotvid_only, args.also_s8)
        print(markdown([r for r in rows if r["shape"] == name], args.block_n).split("\n", 6)[-1], flush=True)
    md = markdown(rows, args.block_n)
    print(md)
    if args.markdown_out:
        args.markdown_out.write_text(md)
    if args.append:
        with args.append.open("a") as fh:
            fh.write("\n" + md)


if __name__ == "__main__":
    main()
