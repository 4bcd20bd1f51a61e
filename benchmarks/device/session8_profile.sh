# Device script (session 8): default build; every GPU test at this commit (TEST_TAIL lines of the summary); then ncu
# stall reasons and pipe use of the int8-fp8 wgmma kernel at Wan2.1-1.3B (head_dim 128) and CogVideoX-5B (64), and
# of the INT4 kernel with Q smoothing at Wan2.1-1.3B. Carry [".whl", ".peers"].
source benchmarks/device/setup.sh
if [ -z "$NO_TESTS" ]; then
  python3 -m pytest -q -m gpu tests -rfs -p no:cacheprovider ${TEST_ARGS} 2>&1 | tee $OUT/gpu_tests.txt | tail -${TEST_TAIL:-15}
fi
M=sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fmaheavy.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fmalite.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__cycles_elapsed.avg.per_second
for shape in ${PROFILE_SHAPES:-wan1.3b-480p cogvideox5b}; do
  timeout 200 ncu --clock-control none -k regex:${PROFILE_KERNEL:-int8fp8_attention} -c 1 --section WarpStateStats --section SchedulerStats \
    --section InstructionStats --metrics $M --print-details all python3 benchmarks/device/one_call.py $shape > $OUT/ncu_$shape.txt 2>&1
  echo "== $shape"; grep -iE 'stall|pipe_|Eligible|Issued Warp|issue_active|Duration|cycles_elapsed|Executed Ipc|No Eligible' $OUT/ncu_$shape.txt | head -45
done
