"""Issue 12's Q-scale question, on the CPU reference: what does INT4 Q with one scale per *group* of query rows cost
against the recipe's per-token Q?

The lever it prices: with Q smoothing each score of the INT4 Hopper kernel is float(S)·k_scale·q_scale + k_bias, one
FMUL and one FFMA after the conversion. A thread of the kernel holds rows g and g + 8 of its warp's 16-row slice;
if those two rows shared a Q scale, k_scale·q_scale would be one product per key and thread (32 per 128-key block)
instead of one per score (64), and the score one FFMA. Groups: ``pair`` (rows 16a + i and 16a + i + 8, the rows one
thread holds), ``row16`` (the 16 rows of a warp's slice). Same synthetic RoPE-structured sets as
``accuracy_study.py`` (V Hadamard on, block_n 128), recipe ``int4`` (range P), Q/K/V smoothed (the INT4 default, one
Q mean per head as the kernels); SQNR against exact float64 attention, mean (worst) over the sets of each source.

    python benchmarks/int4_q_groups_study.py [--rotations none,half] [--seeds 3]
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
from rotvid.kernels.quantize import INT4_QMAX, _symmetric_quantize  # noqa: E402

MODES = ("per-token", "pair", "row16")


def group_amax(x: torch.Tensor, mode: str) -> torch.Tensor:
    """Per-token amax [..., N, 1] of ``x`` [..., N, D] replaced by its group's max (rows from 0 in groups of 16)."""
    a = x.abs().amax(dim=-1)
    n = a.shape[-1]
    n16 = -(-n // 16) * 16
    a = torch.nn.functional.pad(a, (0, n16 - n)).unflatten(-1, (n16 // 16, 16))
    if mode == "pair":  # rows i and i + 8 of each 16
        g = torch.maximum(a[..., :8], a[..., 8:])
        a = torch.cat([g, g], dim=-1)
    elif mode == "row16":
        a = a.amax(dim=-1, keepdim=True).expand_as(a)
    else:
        raise ValueError(f"mode: expected 'pair' or 'row16', got {mode!r}")
    return a.flatten(-2)[..., :n].unsqueeze(-1)


@contextlib.contextmanager
def grouped_q(mode: str):
    """The reference's INT4 pre-processing with Q's scales shared per group (K and V as the recipe)."""
    original_pre, original_quant = reference.preprocess_int4, reference.quantize_per_token_int4

    def patched(q, k, v, **kw):
        calls = []

        def quant(x):  # preprocess_int4 quantizes Q first, then K
            calls.append(x)
            if len(calls) == 1:
                return _symmetric_quantize(x, group_amax(x, mode), INT4_QMAX)
            return original_quant(x)

        reference.quantize_per_token_int4 = quant
        try:
            return original_pre(q, k, v, **kw)
        finally:
            reference.quantize_per_token_int4 = original_quant

    reference.preprocess_int4 = patched
    try:
        yield
    finally:
        reference.preprocess_int4 = original_pre


def main(argv=None):
    cases, rotations = quantizer_study_setup(__doc__.split("\n")[0], argv)
    smoothing = {"smooth_q": True, "smooth_v": True}
    results = {}
    for mode in MODES:
        ctx = grouped_q(mode) if mode != "per-token" else contextlib.nullcontext()
        with ctx:
            for case in cases:
                for row in run_case(case, rotations, ["int4"], True, block_n=128, smoothing=smoothing):
                    results.setdefault((row["source"], row["rotation"], mode), []).append(
                        (row["sqnr_db"], row["cosine"]))
    print("| source | rotation | " + " | ".join(f"Q {m}: SQNR dB mean (worst), mean cos" for m in MODES) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in MODES) + " |")
    for source in sorted({k[0] for k in results}):
        for rot in rotations:
            cells = []
            for mode in MODES:
                v = results[(source, rot, mode)]
                s = [x[0] for x in v]
                cells.append(f"{mean(s):.2f} ({min(s):.2f}), {mean(x[1] for x in v):.6f}")
            print(f"| {source} | {rot} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
