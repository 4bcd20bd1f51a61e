# Device script (session 6, last call): default build; the GPU tests named in $TESTS; then e2e_bench pieces, each
# appended to $OUT/e2e.md as it ends: Wan2.1-1.3B compiled (SDPA, rotvid all calls), then the Wan 14B 720p slice
# compiled with the paper schedule and SageAttention2-8b rows. Carry [".whl", ".peers"].
source benchmarks/device/setup.sh
[ -n "$TESTS" ] && python3 -m pytest -q -m gpu $TESTS -rfs -p no:cacheprovider 2>&1 | tee $OUT/gpu_tests.txt | tail -6
for piece in "--setups wan2.1-1.3b-480p --modes compiled --rows sdpa,all" \
             "--setups wan14b-720p-slice --modes compiled --rows sdpa,schedule,sage"; do
  t1=$(date +%s)
  python3 benchmarks/e2e_bench.py $piece --append $OUT/e2e.md > $OUT/e2e_stdout_$t1.txt 2>&1
  echo "piece [$piece] rc $? in $(( $(date +%s) - t1 )) s"; grep "^|" $OUT/e2e_stdout_$t1.txt | tail -8
done
