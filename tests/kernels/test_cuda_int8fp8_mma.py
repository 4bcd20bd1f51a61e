"""The int8-fp8 mma.sync kernel (``path="mma"``: the sm89 kernel, also runs on sm90) against its reference twin on
the same quantized inputs, and against the sm90 wgmma kernel.

Bounds: as test_cuda_int8fp8.py against the twin (relative L2 <= 2e-3, cosine >= 0.99999: fp32 summation order,
ex2.approx, rare one-step flips of an e4m3 P). Against the wgmma kernel the per-thread arithmetic is the same in the
same order (S exact, the same block max, P8 bytes and row sums), so the outputs differ only by the tensor cores'
fp32 summation order inside a block's P8 V8: relative L2 <= 1e-4, and most elements equal.
"""

import pytest
import torch

from rotvid.kernels import metrics
from rotvid.kernels.recipes.int8_fp8.ops import (
    attention_int8fp8_quantized, int8fp8_attention_cuda, int8fp8_path_for, preprocess_int8fp8_cuda,
)
from tests.kernels.helpers import cuda_qkv
from tests.kernels.test_cuda_int8fp8 import COS_MIN, REL_L2_MAX, to_bhnd, twin

pytestmark = pytest.mark.gpu

# Each kernel is within REL_L2_MAX of the twin (fp16/bf16 output rounding, FP8 tensor-core accumulation, ex2.approx;
# at head_dim 64 the wgmma kernel folds the score offset into the exponent's constant), so the two are within twice
# that of each other. Measured on an H200: 2.3e-4 to 1.9e-3.
MMA_VS_WGMMA_REL_L2_MAX = 2 * REL_L2_MAX


def capability() -> tuple[int, int]:
    if not torch.cuda.is_available():
        pytest.skip("gpu test: no CUDA GPU on this machine (torch.cuda.is_available() is False)")
    return tuple(torch.cuda.get_device_capability())


def needs_e4m3_mma():
    cap = capability()
    if cap not in ((8, 9), (9, 0)):
        pytest.skip(f"the int8-fp8 mma.sync kernel needs sm89 or sm90, this GPU is sm{cap[0]}{cap[1]}")


def needs_sm90():
    cap = capability()
    if cap != (9, 0):
        pytest.skip(f"the wgmma kernel needs sm90, this GPU is sm{cap[0]}{cap[1]}")


# (b, h, n_q, n_kv, d, kv_lens, dtype, layout, smooth_k, smooth_v)
CASES = [
    (1, 2, 1, 1, 64, None, torch.float16, "BHND", True, False),
    (1, 2, 333, 517, 64, None, torch.bfloat16, "BHND", True, True),
    (1, 2, 333, 517, 128, None, torch.float16, "BNHD", True, False),
    (2, 2, 333, 517, 128, [517, 129], torch.bfloat16, "BHND", False, True),
    (2, 3, 97, 300, 64, [1, 257], torch.float16, "BNHD", True, True),
    (1, 2, 1025, 1025, 128, None, torch.bfloat16, "BNHD", True, True),
    (1, 1, 4099, 4099, 64, None, torch.bfloat16, "BHND", True, False),
]
IDS = [f"b{c[0]}h{c[1]}q{c[2]}k{c[3]}d{c[4]}{c[7]}{'-lens' if c[5] else ''}" for c in CASES]


def run_kernel(kq, case, kv_lens, path):
    """The kernel on ``kq`` into an output poisoned with NaN (every element must be written)."""
    b, h, n_q, n_kv, d, _, dtype, layout, _, _ = case
    shape = (b, n_q, h, d) if layout == "BNHD" else (b, h, n_q, d)
    out = torch.full(shape, float("nan"), dtype=dtype, device="cuda")
    attention_int8fp8_quantized(kq, n_q=n_q, n_kv=n_kv, head_dim=d, kv_lens=kv_lens, out_dtype=dtype,
                                layout=layout, out=out, path=path)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any(), f"{path}: output elements left unwritten (NaN poison survived)"
    return to_bhnd(out, layout).float()


def quantized(case, seed):
    b, h, n_q, n_kv, d, lens, dtype, layout, smooth_k, smooth_v = case
    q, k, v, kv_lens = cuda_qkv(b, h, n_q, n_kv, d, dtype, layout, seed=seed, kv_lens=lens)
    kq = preprocess_int8fp8_cuda(q, k, v, layout=layout, kv_lens=kv_lens, smooth_k=smooth_k, smooth_v=smooth_v)
    return (q, k, v, kv_lens), kq


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_mma_kernel_matches_twin_on_same_quantized_inputs(case):
    needs_e4m3_mma()
    (_, _, _, kv_lens), kq = quantized(case, seed=41 + case[3])
    got = run_kernel(kq, case, kv_lens, "mma")
    ref = twin(kq, case[2], case[3], kv_lens)
    assert metrics.relative_l2(ref, got) <= REL_L2_MAX
    assert metrics.cosine_similarity(ref, got) >= COS_MIN


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_mma_kernel_agrees_with_wgmma_kernel(case):
    needs_sm90()
    (_, _, _, kv_lens), kq = quantized(case, seed=77 + case[2])
    mma = run_kernel(kq, case, kv_lens, "mma")
    wgmma = run_kernel(kq, case, kv_lens, "wgmma")
    assert metrics.relative_l2(wgmma, mma) <= MMA_VS_WGMMA_REL_L2_MAX
    assert metrics.cosine_similarity(wgmma, mma) >= COS_MIN


def test_end_to_end_mma_path_and_default_path():
    """int8fp8_attention_cuda with path="mma" equals the quantized call; the default path is the arch table's."""
    needs_e4m3_mma()
    case = CASES[2]
    (q, k, v, kv_lens), kq = quantized(case, seed=5)
    full = int8fp8_attention_cuda(q, k, v, layout=case[7], kv_lens=kv_lens, smooth_k=case[8],
                                  smooth_v=case[9], path="mma")
    assert torch.equal(to_bhnd(full, case[7]).float(), run_kernel(kq, case, kv_lens, "mma"))
    default = int8fp8_path_for(capability())
    assert default == ("wgmma" if capability() == (9, 0) else "mma")


def test_mma_path_under_torch_compile():
    needs_e4m3_mma()
    q, k, v, _ = cuda_qkv(1, 2, 300, 300, 64, torch.bfloat16, "BNHD", seed=21)

    def f(q, k, v):
        return int8fp8_attention_cuda(q, k, v, layout="BNHD", smooth_v=True, path="mma")

    assert torch.equal(torch.compile(f, fullgraph=True)(q, k, v), f(q, k, v))
