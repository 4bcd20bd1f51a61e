# Device script: Nsight Compute profile of the default wgmma kernel at the Wan2.1-1.3B 480p shape.
export PYTHONPATH=$PWD ROTVID_EXT_CACHE=/tmp/rext
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
grep -E "Duration|Issue Slots Busy|Eligible Warps|Active Warps Per|Stall [A-Z]|Pipe (Alu|Fma|Tensor) Cycles|Pipe Xu" $OUT/ncu.txt | head -30
