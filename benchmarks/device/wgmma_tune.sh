# Device script: tuning build of the wgmma kernel, variant timings, and an Nsight Compute profile.
export PYTHONPATH=$PWD ROTVID_EXT_CACHE=/tmp/rext ROTVID_EXT_CUDA_FLAGS=-DROTVID_WGMMA_VARIANTS
python3 -c "from rotvid.kernels import cuda_backend as c; c.load_extension()" > $OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
python3 benchmarks/kernel_variants.py --var ROTVID_WGMMA_VARIANT=${VARIANTS:-0,1,2,3,4,5,6,7} --shapes wan1.3b-480p cogvideox5b ${VARIANT_ARGS:-} 2>&1 | tail -22
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
ncu --clock-control none -k regex:wgmma -s ${NCU_SKIP:-1} -c 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section Occupancy --section MemoryWorkloadAnalysis --import-source yes --section SourceCounters -o $OUT/prof python3 /tmp/one.py > $OUT/ncu_run.log 2>&1
ncu --import $OUT/prof.ncu-rep --print-details all > $OUT/ncu.txt 2>&1
ncu --import $OUT/prof.ncu-rep --page source --csv --print-source=sass > $OUT/source.csv 2>&1
grep -E "Duration|Issue Slots Busy|Eligible Warps|Active Warps Per|No Eligible|Stall|Pipe|Throughput|Registers|Warp Cycles" $OUT/ncu.txt | head -60
fi
if [ -n "$TESTS" ]; then
  unset ROTVID_EXT_CUDA_FLAGS
  python3 -m pytest -q -x tests/kernels/test_cuda_int4.py -k "$TESTS" 2>&1 | tail -15
fi
if [ -n "$SASS" ]; then
  SO=$(find /tmp/rext -name "*.so" | head -1)
  for f in $(cuobjdump -sass $SO | grep -oE "Function : \S+wgmma\S+" | awk '{print $3}' | sort -u); do
    n=$(cuobjdump -sass -fun $f $SO | grep -oE "\bR[0-9]+\b" | sed 's/R//' | sort -n | tail -1)
    l=$(cuobjdump -sass -fun $f $SO | grep -cE "LDL|STL")
    echo "$f maxreg=R$n local=$l"
  done 2>/dev/null | sed 's/_ZN6rotvid2wg27int4_attention_wgmma_kernelI//;s/EEEvNS.*maxreg/ maxreg/' > $OUT/sass_regs.txt
  F=$(cuobjdump -sass $SO | grep -oE "Function : \S+wgmma_kernelILi128ELi0ELi2ELb0ELi1\S+" | awk '{print $3}' | head -1)
  cuobjdump -sass -fun $F $SO > $OUT/sass_d128.txt 2>/dev/null
fi
