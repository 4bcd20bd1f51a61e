"""Tuning aid (tuning build, -DROTVID_INT8FP8_VARIANTS): two int8-fp8 kernel variants claiming the same bits, compared.

Each case runs both variants into NaN-poisoned outputs (``split_tail=False``: every row in one CTA, the summation
order of the default) and requires no NaN in the valid rows and bit equality; it also prints each one's relative
L2 error against the float64 twin of the quantized operands. Cases cover odd and even query-tile counts per head,
several heads, per-batch kv_lens and both head dims.

    ROTVID_EXT_CUDA_FLAGS=-DROTVID_INT8FP8_VARIANTS python3 benchmarks/device/int8fp8_variant_equal.py --variants 50,70

(Written for the K/V multicast variant 70 of session 13, commit b70abd1, reverted after its A/B; RESULTS.md.)
"""
import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from rotvid.kernels import cuda_backend as cb  # noqa: E402

CASES = (  # (B, H, N, D, kv_lens)
    (1, 3, 1900, 128, None),   # 15 query tiles per head: a pair with one CTA past the last tile
    (1, 2, 2000, 128, None),   # 16 tiles
    (2, 2, 1500, 128, [1100, 333]),
    (1, 3, 1900, 64, None),
    (2, 1, 4099, 64, [1025, 129]),
    (1, 1, 97, 128, None),     # one tile per head
)


def run(variant: str, qkv, n: int, d: int, kv_lens, shape) -> torch.Tensor:
    os.environ["ROTVID_INT8FP8_VARIANT"] = variant
    out = torch.full(shape, float("nan"), device="cuda", dtype=torch.bfloat16)
    cb.attention_int8fp8_quantized(qkv, n_q=n, n_kv=n, head_dim=d, kv_lens=kv_lens, out=out, split_tail=False)
    torch.cuda.synchronize()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", required=True, help="two variant numbers, e.g. 50,70")
    args = ap.parse_args()
    a, b = args.variants.split(",")
    failures = 0
    for bsz, h, n, d, lens in CASES:
        torch.manual_seed(n + d)
        q, k, v = (torch.randn(bsz, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        kv_lens = None if lens is None else torch.tensor(lens, device="cuda", dtype=torch.int32)
        qkv = cb.preprocess_int8fp8_cuda(q, k, v, kv_lens=kv_lens)
        oa, ob = (run(var, qkv, n, d, kv_lens, (bsz, h, n, d)) for var in (a, b))
        nan = bool(torch.isnan(oa).any() or torch.isnan(ob).any())
        same = torch.equal(oa, ob)
        diff = float((oa.float() - ob.float()).abs().max())
        ok = same and not nan
        failures += not ok
        print(f"B{bsz} H{h} N{n} D{d} kv_lens {lens}: {'OK' if ok else 'FAIL'} (bit-equal {same}, NaN {nan}, "
              f"max |diff| {diff:.3g})", flush=True)
    os.environ.pop("ROTVID_INT8FP8_VARIANT", None)
    print(f"{len(CASES) - failures}/{len(CASES)} cases equal")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
