# Device script (session 6): tuning build; the int8-fp8 GPU tests on variant $TEST_VARIANT; the scores-to-float
# variants (MAGIC 1 / 2) against the default; ncu pipe and stall figures of the head_dim-64 kernel, default and
# variant 14; the SASS of the tuning build (gzip). Carry [".whl", ".peers"].
export ROTVID_EXT_CUDA_FLAGS=-DROTVID_INT8FP8_VARIANTS
source benchmarks/device/setup.sh
(cuobjdump -sass /tmp/rext/*/*.so 2>/dev/null | gzip -c) > $OUT/sass.txt.gz
ROTVID_INT8FP8_VARIANT=${TEST_VARIANT:-14} python3 -m pytest -q -m gpu tests/kernels/test_cuda_int8fp8.py -rfs -p no:cacheprovider 2>&1 | tail -3
python3 benchmarks/device/int8fp8_variants.py --variants ${VARIANTS:-1,14,15,16,17,1,14,15} --shapes ${SHAPES:-cogvideox5b wan1.3b-480p wan14b-720p} 2>&1 | tee $OUT/variants.txt
if command -v ncu >/dev/null; then
  for var in 1 14; do
    ROTVID_INT8FP8_VARIANT=$var timeout 120 ncu -k regex:int8fp8_attention -c 1 --section ComputeWorkloadAnalysis --section WarpStateStats --section InstructionStats --section SchedulerStats --section SpeedOfLight python3 benchmarks/device/one_call.py cogvideox5b > $OUT/ncu_v$var.txt 2>&1
  done
  grep -E 'Pipe|Issue|Stall|Throughput|Executed Ipc|No Eligible|Warp Cycles' $OUT/ncu_v1.txt | head -40
else
  echo "no ncu"
fi
