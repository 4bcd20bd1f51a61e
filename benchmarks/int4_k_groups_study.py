"""Issue 12's first quantizer question, on the CPU reference: what does INT4 K with one scale per *group* of keys
cost against the recipe's per-token K?

The grouped scale is the int8-fp8 kernel's granularity (one scale per group of 32 keys of a 128-key block: the keys
one kernel thread holds, :func:`rotvid.kernels.quantize.k_group_of_key`), which lets a kernel fold K's scale into
one multiplier per thread and take the row max on the integers. Same synthetic RoPE-structured sets as
``accuracy_study.py`` (V Hadamard on, block_n 128), recipe ``int4`` (range P), with and without Q smoothing; SQNR
against exact float64 attention, mean (worst) over the sets of each source.

    python benchmarks/int4_k_groups_study.py [--rotations none,half] [--seeds 3]
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from statistics import mean

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accuracy_study import quantizer_study_setup, run_case  # noqa: E402

import rotvid.kernels.reference as reference  # noqa: E402
from rotvid.kernels.quantize import INT4_QMAX, K_GROUP_BLOCK, K_GROUPS, _symmetric_quantize  # noqa: E402


def quantize_k_groups_int4(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """INT4 of ``k`` [B, H, N, D] with one scale per group of 32 keys per 128-key block (all keys valid here)."""
    x = k.float() if k.dtype != torch.float64 else k
    b, h, n, _ = x.shape
    nb = -(-n // K_GROUP_BLOCK)
    a = torch.nn.functional.pad(x.abs().amax(dim=-1), (0, nb * K_GROUP_BLOCK - n))
    g_amax = a.view(b, h, nb, K_GROUP_BLOCK // 8, K_GROUPS, 2).amax(dim=(3, 5))  # [B, H, nb, 4]
    j = torch.arange(n)
    per_key = g_amax[:, :, j // K_GROUP_BLOCK, (j % 8) // 2].unsqueeze(-1)
    return _symmetric_quantize(x, per_key, INT4_QMAX)


@contextlib.contextmanager
def grouped_k():
    """The reference's INT4 pre-processing with grouped K scales (Q and V as the recipe)."""
    original = reference.preprocess_int4

    def patched(q, k, v, **kw):
        qkv = original(q, k, v, **kw)
        k_s = qkv.k_smoothed if qkv.k_smoothed is not None else _smoothed_k(k, kw)
        qkv.k_hat, qkv.k_scale = quantize_k_groups_int4(k_s)
        return qkv

    reference.preprocess_int4 = patched
    try:
        yield
    finally:
        reference.preprocess_int4 = original


def _smoothed_k(k, kw):
    k = reference.to_bhnd(k, kw.get("layout", "BHND"))
    k = k.to(reference.compute_dtype_for(k))
    return k - reference.masked_mean(k, kw.get("kv_lens")) if kw.get("smooth_k", True) else k


def main(argv=None):
    cases, rotations = quantizer_study_setup(__doc__.split("\n")[0], argv)
    results = {}
    for smooth_q in (False, True):
        for k_mode in ("per-token", "grouped"):
            ctx = grouped_k() if k_mode == "grouped" else contextlib.nullcontext()
            with ctx:
                for case in cases:
                    for row in run_case(case, rotations, ["int4"], True, block_n=128, smoothing={"smooth_q": smooth_q}):
                        key = (row["source"], row["rotation"], smooth_q, k_mode)
                        results.setdefault(key, []).append(row["sqnr_db"])
    print("| source | rotation | K per token | K grouped | K per token + Q smoothing | K grouped + Q smoothing |")
    print("| --- | --- | --- | --- | --- | --- |")
    for source in sorted({k[0] for k in results}):
        for rot in rotations:
            cells = []
            for smooth_q in (False, True):
                for k_mode in ("per-token", "grouped"):
                    v = results[(source, rot, smooth_q, k_mode)]
                    cells.append(f"{mean(v):.2f} ({min(v):.2f})")
            print(f"| {source} | {rot} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
