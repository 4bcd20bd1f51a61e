# Device script (session 6): default build; the int8-fp8 GPU tests; ncu stall reasons, pipe use and source
# counters of the int8-fp8 kernel at Wan2.1-1.3B (head_dim 128) and CogVideoX-5B (head_dim 64). Carry [".whl"].
source benchmarks/device/setup.sh
python3 -m pytest -q -m gpu tests/kernels/test_cuda_int8fp8.py -rfs -p no:cacheprovider 2>&1 | tail -3
M=sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fmaheavy.avg.pct_of_peak_sustained_active
for shape in wan1.3b-480p cogvideox5b; do
  timeout 200 ncu -k regex:int8fp8_attention -c 1 --section WarpStateStats --section SchedulerStats --section SourceCounters --metrics $M --print-details all python3 benchmarks/device/one_call.py $shape > $OUT/ncu_$shape.txt 2>&1
  grep -iE 'stall|pipe_|Eligible|Issued Warp' $OUT/ncu_$shape.txt | head -40
done
