"""Profiling aid: one int8-fp8 attention call (pre-processing, then the kernel) at a kernel_bench shape, for ncu.

    ROTVID_INT8FP8_VARIANT=14 ncu -k regex:int8fp8_attention -c 1 python benchmarks/device/one_call.py cogvideox5b
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.kernel_bench import SHAPES  # noqa: E402
from rotvid.kernels import cuda_backend as cb  # noqa: E402

sh = SHAPES[sys.argv[1] if len(sys.argv) > 1 else "cogvideox5b"]
q, k, v = (torch.randn(sh.b, sh.h, sh.n, sh.d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
kq = cb.preprocess_int8fp8_cuda(q, k, v)
cb.attention_int8fp8_quantized(kq, n_q=sh.n, n_kv=sh.n, head_dim=sh.d)
torch.cuda.synchronize()
