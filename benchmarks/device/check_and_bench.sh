# Device script: default build, kernel tests (wgmma + pre-processing), pre-processing breakdown, kernel_bench.
export PYTHONPATH=$PWD ROTVID_EXT_CACHE=/tmp/rext
python3 -c "from rotvid.kernels import cuda_backend as c; c.load_extension()" > $OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
python3 -m pytest -q tests/kernels/test_cuda_int4.py -k "${TESTS:-wgmma or preprocess}" 2>&1 | tail -6
python3 - <<'PY' 2>&1 | tail -14
import torch
from torch.profiler import profile, ProfilerActivity
from rotvid.kernels import cuda_backend as c
q, k, v = (torch.randn(1, 12, 32760, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for _ in range(3): c.preprocess_int4_cuda(q, k, v)
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(10): c.preprocess_int4_cuda(q, k, v)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=10, max_name_column_width=60))
PY
python3 benchmarks/kernel_bench.py --shapes ${SHAPES:-wan1.3b-480p cogvideox5b} ${BENCH_ARGS:---rotvid-only --also-s8 --no-sage} --markdown-out $OUT/bench.md 2>&1 | tail -${BENCH_TAIL:-16}
