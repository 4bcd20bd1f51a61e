# Device script (session 6, last call): default build; the GPU tests named in $TESTS; the pre-processing timing
# ($PRE_ARGS); then e2e_bench pieces, each appended to $OUT/e2e.md as it ends: Wan2.1-1.3B compiled (SDPA, rotvid
# all calls), then eager Wan2.1-1.3B and the Wan 14B 720p slice (SDPA, rotvid all calls). Carry [".whl", ".peers"].
source benchmarks/device/setup.sh
[ -n "$TESTS" ] && python3 -m pytest -q -m gpu $TESTS -rfs -p no:cacheprovider 2>&1 | tee $OUT/gpu_tests.txt | tail -6
python3 benchmarks/device/pre_int8fp8_time.py $PRE_ARGS 2>&1 | tee $OUT/pre_time.txt | grep '^|' | tail -7
for piece in "--setups wan2.1-1.3b-480p --modes compiled --rows sdpa,all" \
             "--setups wan2.1-1.3b-480p,wan14b-720p-slice --modes eager --rows sdpa,all"; do
  t1=$(date +%s)
  python3 benchmarks/e2e_bench.py $piece --append $OUT/e2e.md > $OUT/e2e_stdout_$t1.txt 2>&1
  echo "piece [$piece] rc $? in $(( $(date +%s) - t1 )) s"; grep "^|" $OUT/e2e_stdout_$t1.txt | tail -8
done
