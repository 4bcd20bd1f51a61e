# Device script (session 5): e2e_bench pieces, each appended to $OUT/e2e.md as soon as it ends (a later piece
# running out of time loses only itself). Carry [".whl", ".peers"]; set ROTVID_COMMIT.
# E2E_PIECES: ";"-separated e2e_bench argument lists (default: Wan2.1-1.3B eager, all rows).
# TESTS: pytest paths and options, split on spaces (a -k expression with spaces does not survive it).
source benchmarks/device/setup.sh
[ -n "$TESTS" ] && python3 -m pytest -q -m gpu $TESTS -rfs -p no:cacheprovider 2>&1 | tee $OUT/gpu_tests.txt | tail -4
IFS=';' read -ra pieces <<< "${E2E_PIECES:---setups wan2.1-1.3b-480p --modes eager}"
for piece in "${pieces[@]}"; do
  t1=$(date +%s)
  python3 benchmarks/e2e_bench.py $piece --append $OUT/e2e.md > $OUT/e2e_stdout_$t1.txt 2>&1
  echo "piece [$piece] rc $? in $(( $(date +%s) - t1 )) s"; grep "^|" $OUT/e2e_stdout_$t1.txt | tail -8
done
