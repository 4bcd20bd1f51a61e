"""Accuracy against float64 attention as the sequence grows (CPU reference; the kernels' exact model).

At video lengths the attention output of a diffuse softmax is small (≈ the mean of V over the keys), so errors
that do not average out over the keys show up here and not at N = 2K. One head, head_dim 128, bf16 Gaussian
Q, K, V with a channel bias on K (what K smoothing removes), 256 sampled query rows, block_n 128; cosine of
the recipe's output against float64 attention, V smoothing on and off, and the int8-fp8 error split into its
parts (only Q/K INT8, only P FP8, only V FP8; the rest exact).

    python -m benchmarks.accuracy_vs_length --lengths 2048,32760,119056
"""

from __future__ import annotations

import argparse
from contextlib import contextmanager

import torch

# the int8-fp8 operands look their quantizers up in their own module: R's names are the ones to replace
import rotvid.kernels.recipes.int8_fp8.reference as R
from rotvid.kernels.quantize import FP8_E4M3_MAX
from rotvid.kernels.recipes import attention_reference


def attention_fp64(q, k, v):
    s = (q.double() @ k.double().transpose(-1, -2)) * q.shape[-1] ** -0.5
    return torch.softmax(s, dim=-1) @ v.double()


def cosine(a, b):
    return float(torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0))


@contextmanager
def exact(*parts):
    """Replace the int8-fp8 quantizers named in ``parts`` ("qk", "p", "v") by exact pass-throughs."""
    saved = (R.quantize_per_token_int8, R.quantize_k_groups_int8, R.quant_p_fp8, R.quantize_per_channel_fp8)
    if "qk" in parts:
        R.quantize_per_token_int8 = lambda x: (x, torch.ones_like(x[..., :1]))
        R.quantize_k_groups_int8 = lambda x, kv_lens=None: (x, torch.ones_like(x[..., :1]), None)
    if "p" in parts:
        R.quant_p_fp8 = lambda p: p * FP8_E4M3_MAX
    if "v" in parts:
        R.quantize_per_channel_fp8 = lambda v, valid=None: (v * valid.to(v.dtype) if valid is not None else v,
                                                            torch.ones_like(v[..., :1, :]))
    try:
        yield
    finally:
        R.quantize_per_token_int8, R.quantize_k_groups_int8, R.quant_p_fp8, R.quantize_per_channel_fp8 = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="2048,32760,119056")
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print("| N | int4 smooth V | int4 no smooth V | int8-fp8 smooth V | int8-fp8 no smooth V | "
          "only Q/K INT8 | only P FP8 | only V FP8 (no smooth V) | only V FP8 (smooth V) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for n in (int(x) for x in args.lengths.split(",")):
        g = torch.Generator().manual_seed(args.seed)
        q, k, v = (torch.randn(1, 1, n, 128, generator=g).bfloat16().float() for _ in range(3))
        k = (k + torch.randn(1, 1, 1, 128, generator=g)).bfloat16().float()
        rows = torch.randperm(n, generator=g)[: args.rows].sort().values
        qr = q[:, :, rows]
        truth = attention_fp64(qr, k, v)

        def run(recipe, smooth_v):
            return cosine(truth, attention_reference(qr, k, v, recipe=recipe, block_n=128, smooth_v=smooth_v))

        cells = [run("int4", True), run("int4", False), run("int8-fp8", True), run("int8-fp8", False)]
        with exact("p", "v"):
            cells.append(run("int8-fp8", False))
        with exact("qk", "v"):
            cells.append(run("int8-fp8", False))
        with exact("qk", "p"):
            cells += [run("int8-fp8", False), run("int8-fp8", True)]
        print(f"| {n} | " + " | ".join(f"{c:.5f}" for c in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
