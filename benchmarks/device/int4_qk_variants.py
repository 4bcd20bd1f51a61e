"""Tuning aid (tuning build, -DROTVID_WGMMA_VARIANTS): the INT4 Hopper kernel's scores to float (``QK`` in
``int4_attention_wgmma.cuh``), each variant on the default's schedule.

- ``0``: the default: Q^ K^T on s32 accumulators, one I2F per score.
- ``43``: Q^ K^T on the e4m3 tensor cores (Q^ and K^ as sign-magnitude bytes, made here from the operands; no
  pre-processing writes them): the FP32 accumulator holds S 2^-18 exactly, no conversion.
- ``44``: s32 accumulators started at the bits of 1.5 2^23, the conversion replaced by one FADD.

All three must give the same bits. ``--check``: every case runs the three into NaN-poisoned outputs (tail split off)
and prints whether 43 and 44 equal the default bit for bit, and each one's relative L2 error against the reference
on the same quantized inputs. ``--time``: attention-only time at the kernel_bench shapes, interleaved rounds, INT4
range P with Q/K/V smoothing (kernel_bench's rotvid-int4 operands), with cuDNN and the peer when importable.

    ROTVID_EXT_CUDA_FLAGS=-DROTVID_WGMMA_VARIANTS python3 benchmarks/device/int4_qk_variants.py --check --time

(Session 14 timed 43 on the schedule of fbf1c47's default, where it lost up to 12%: RESULTS.md.)
"""
import argparse
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.kernel_bench import SHAPES, _under, time_interleaved  # noqa: E402
from rotvid.kernels import cuda_backend as cb  # noqa: E402
from rotvid.kernels import metrics  # noqa: E402
from rotvid.kernels.reference import attention_from_quantized, preprocess_int4  # noqa: E402

VARIANTS = ("0", "43", "44")


def with_qk_sign_magnitude(kq):
    """Variant 43's operands: Q^ and K^ as sign-magnitude bytes too (passed as int8, which the binding checks)."""
    return kq._replace(q_hat=cb.sign_magnitude_bytes(kq.q_hat).view(torch.int8),
                       k_hat=cb.sign_magnitude_bytes(kq.k_hat).view(torch.int8))


def attend(kq, kq_sm_qk, variant, *, n, d, kv_lens, p_mode, out=None, split_tail=True):
    os.environ["ROTVID_WGMMA_VARIANT"] = variant
    return cb.attention_int4_quantized(kq_sm_qk if variant == "43" else kq, n_q=n, n_kv=n, head_dim=d, block_n=128,
                                       kv_lens=kv_lens, p_mode=p_mode, path="wgmma", out=out,
                                       out_dtype=torch.bfloat16, split_tail=split_tail)


CASES = (  # (B, H, N, D, kv_lens, smooth_q, p_mode)
    (1, 3, 1900, 128, None, False, "range"),
    (1, 3, 1900, 128, None, True, "range"),
    (2, 2, 1500, 128, [1100, 333], True, "sym"),
    (1, 3, 1900, 64, None, True, "range"),
    (2, 1, 4099, 64, [1025, 129], False, "sym"),
    (2, 2, 3001, 64, [3001, 700], True, "range"),
    (1, 1, 97, 128, None, True, "range"),
    (1, 2, 8192, 128, None, True, "range"),
)


def check() -> int:
    failures = 0
    for bsz, h, n, d, lens, sq, p_mode in CASES:
        torch.manual_seed(n + d + sq)
        q, k, v = (torch.randn(bsz, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        q = q + 2.0 * torch.randn(1, h, 1, d, device="cuda", dtype=torch.bfloat16)  # a shared bias for Q smoothing
        kv_lens = None if lens is None else torch.tensor(lens, device="cuda", dtype=torch.int32)
        ref_q = preprocess_int4(q, k, v, kv_lens=kv_lens, block_n=128, smooth_v=True, smooth_q=sq)
        ref = attention_from_quantized(ref_q, p_mode=p_mode, out_dtype=torch.float32)
        kq = cb.pack_reference_quantized(ref_q, p_mode=p_mode, path="wgmma")
        kq_sm = with_qk_sign_magnitude(kq)
        outs = {}
        for var in VARIANTS:
            out = torch.full((bsz, h, n, d), float("nan"), device="cuda", dtype=torch.bfloat16)
            attend(kq, kq_sm, var, n=n, d=d, kv_lens=kv_lens, p_mode=p_mode, out=out, split_tail=False)
            torch.cuda.synchronize()
            outs[var] = out
        nan = any(bool(torch.isnan(o).any()) for o in outs.values())
        same = {var: torch.equal(outs[var], outs["0"]) for var in VARIANTS[1:]}
        rel = {var: max(metrics.relative_l2(ref[bi, hi], o[bi, hi].float()) for bi in range(bsz) for hi in range(h))
               for var, o in outs.items()}
        ok = not nan and all(same.values()) and max(rel.values()) <= 2e-3 + 2.0**-8
        failures += not ok
        print(f"B{bsz} H{h} N{n} D{d} kv_lens {lens} smooth_q {sq} {p_mode}: {'OK' if ok else 'FAIL'} "
              f"(NaN {nan}; bit-equal to the default: {same}; worst rel L2 vs reference "
              + ", ".join(f"{k} {x:.2e}" for k, x in rel.items()) + ")", flush=True)
    print(f"{len(CASES) - failures}/{len(CASES)} cases OK")
    return failures


def time_shapes(shapes, rounds: int) -> None:
    try:
        from sageattention import sageattn_qk_int8_pv_fp8_cuda_sm90
    except ImportError as err:
        sageattn_qk_int8_pv_fp8_cuda_sm90 = None
        print(f"(the peer is not importable: {err})")
    print("| shape | method | ms | vs cuDNN | vs the default (0) |")
    print("| --- | --- | --- | --- | --- |")
    for name in shapes:
        s = SHAPES[name]
        torch.manual_seed(0)
        q, k, v = (torch.randn(s.b, s.h, s.n, s.d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        k += torch.randn(1, s.h, 1, s.d, device="cuda", dtype=torch.bfloat16)
        kv_lens = None if s.kv_len is None else torch.full((s.b,), s.kv_len, dtype=torch.int32, device="cuda")
        kq = cb.preprocess_int4_cuda(q, k, v, kv_lens=kv_lens, block_n=128, smooth_v=True, smooth_q=True,
                                     path="wgmma")
        kq_sm = with_qk_sign_magnitude(kq)
        timers = {"cudnn": _under(SDPBackend.CUDNN_ATTENTION, lambda: F.scaled_dot_product_attention(q, k, v))}
        if sageattn_qk_int8_pv_fp8_cuda_sm90 is not None:
            timers["sage"] = lambda: sageattn_qk_int8_pv_fp8_cuda_sm90(
                q, k, v, tensor_layout="HND", qk_quant_gran="per_thread", pv_accum_dtype="fp32+fp32")
        for var in VARIANTS:
            timers[var] = (lambda var=var: attend(kq, kq_sm, var, n=s.n, d=s.d, kv_lens=kv_lens, p_mode="range"))
        t = time_interleaved(timers, rounds)
        for key, ms in t.items():
            label = {"cudnn": "sdpa-cudnn", "sage": "sageattention2-8b"}.get(key, f"rotvid-int4 attn only, v{key}")
            print(f"| {name} | {label} | {ms:.2f} | {t['cudnn'] / ms:.3f}× | {t['0'] / ms:.3f}× |", flush=True)
    os.environ.pop("ROTVID_WGMMA_VARIANT", None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    failures = check() if args.check else 0
    if args.time:
        time_shapes(args.shapes, args.rounds)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
