"""Device helper: torch.profiler table of the CUDA pre-processing kernels at Wan2.1-1.3B 480p (10 calls)."""

import torch
from torch.profiler import ProfilerActivity, profile

from rotvid.kernels import cuda_backend as c

q, k, v = (torch.randn(1, 12, 32760, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for _ in range(3):
    c.preprocess_int4_cuda(q, k, v)
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(10):
        c.preprocess_int4_cuda(q, k, v)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=10, max_name_column_width=60))
