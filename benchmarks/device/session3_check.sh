# Device script (session 3): default build, the kernel GPU tests, the pre-processing breakdown, then a tuning build
# with the wgmma variants (VARIANTS) at the Wan2.1-1.3B and CogVideoX-5B shapes, and (PROFILE=1) an Nsight
# Compute source-level profile of the default kernel at Wan2.1-1.3B.
export PYTHONPATH=${PYTHONPATH:-$PWD} ROTVID_EXT_CACHE=/tmp/rext
python3 -c "from rotvid.kernels import cuda_backend as c; c.load_extension()" > $OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
python3 -m pytest -q ${TEST_PATHS:-tests/kernels/test_cuda_int4.py} -m gpu 2>&1 | tail -${TEST_TAIL:-4}
sed -n '/python3 - <</,/^PY/p' benchmarks/device/check_and_bench.sh | sed '1d;$d' > /tmp/prof.py
python3 /tmp/prof.py 2>&1 | grep -E "rotvid|elementwise|fill|Self CUDA time"
if [ -n "$VARIANTS" ]; then
  ROTVID_EXT_CUDA_FLAGS=-DROTVID_WGMMA_VARIANTS python3 -c "from rotvid.kernels import cuda_backend as c; c.load_extension()" > $OUT/build_var.log 2>&1 || { tail -20 $OUT/build_var.log; exit 1; }
  ROTVID_EXT_CUDA_FLAGS=-DROTVID_WGMMA_VARIANTS python3 benchmarks/kernel_variants.py --var ROTVID_WGMMA_VARIANT=$VARIANTS --shapes ${VSHAPES:-wan1.3b-480p cogvideox5b} 2>&1 | tail -14
fi
if [ -n "$PROFILE" ]; then
cat > /tmp/one.py <<'PY'
import torch
from rotvid.kernels import cuda_backend as c
q, k, v = (torch.randn(1, 12, 32760, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
qkv = c.preprocess_int4_cuda(q, k, v)
for _ in range(2):
    c.attention_int4_quantized(qkv, n_q=32760, n_kv=32760, head_dim=128)
torch.cuda.synchronize()
PY
  ncu --clock-control none -k regex:wgmma -s 1 -c 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats --import-source yes --section SourceCounters -o $OUT/prof python3 /tmp/one.py > $OUT/ncu_run.log 2>&1
  ncu --import $OUT/prof.ncu-rep --print-details all > $OUT/ncu.txt 2>&1
  ncu --import $OUT/prof.ncu-rep --page source --csv --print-source=sass > $OUT/source.csv 2>&1
  grep -E "Duration|Issue Slots Busy|Eligible Warps|Active Warps Per|No Eligible|Stall|SM Frequency" $OUT/ncu.txt | head -30
  rm -f $OUT/prof.ncu-rep
fi
