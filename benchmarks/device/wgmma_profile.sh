# Device script: Nsight Compute profile (with source-level stall samples) of the wgmma kernel's second call at
# Wan2.1-1.3B 480p; report, details and the per-instruction CSV go to $OUT (the .ncu-rep is removed: too large).
cat > /tmp/one.py <<'PY'
import torch
from rotvid.kernels import cuda_backend as c
q, k, v = (torch.randn(1, 12, 32760, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
qkv = c.preprocess_int4_cuda(q, k, v)
for _ in range(2):
    c.attention_int4_quantized(qkv, n_q=32760, n_kv=32760, head_dim=128)
torch.cuda.synchronize()
PY
ncu --clock-control none -k regex:int4_attention_wgmma -s ${NCU_SKIP:-1} -c 1 --section SpeedOfLight --section WarpStateStats \
  --section SchedulerStats --section ComputeWorkloadAnalysis --section Occupancy --section MemoryWorkloadAnalysis \
  --section InstructionStats --import-source yes --section SourceCounters -o $OUT/prof python3 /tmp/one.py > $OUT/ncu_run.log 2>&1
ncu --import $OUT/prof.ncu-rep --print-details all > $OUT/ncu.txt 2>&1
ncu --import $OUT/prof.ncu-rep --page source --csv --print-source=sass > $OUT/source.csv 2>&1
grep -E "Duration|SM Frequency|Issue Slots Busy|Eligible Warps|Active Warps Per|No Eligible|Stall|Pipe|Throughput|Registers" $OUT/ncu.txt | head -60
rm -f $OUT/prof.ncu-rep
