# Device script: A/B of the int8-fp8 kernel between a saved tree (.ab_old: git archive <rev> rotvid benchmarks tests)
# and the working tree, on one machine, two rounds; then the int8-fp8 GPU tests of the working tree.
export MAX_JOBS=16 PYTHONUNBUFFERED=1
test -d .ab_old/rotvid || { echo ".ab_old missing"; exit 1; }
rm -rf /tmp/old && cp -r .ab_old /tmp/old
for tree in /tmp/old $PWD; do
  (cd $tree && PYTHONPATH=$tree ROTVID_EXT_CACHE=/tmp/rext_$(basename $tree) python3 -c "from rotvid.kernels import cuda_backend as c; c.load_extension()" > /tmp/build_$(basename $tree).log 2>&1 || tail -30 /tmp/build_$(basename $tree).log) &
done
wait
for round in 1 2; do
  for tree in /tmp/old $PWD; do
    echo "== $tree round $round"
    (cd $tree && PYTHONPATH=$tree ROTVID_EXT_CACHE=/tmp/rext_$(basename $tree) python3 benchmarks/kernel_bench.py \
      --shapes ${SHAPES:-wan1.3b-480p cogvideox5b} --no-sage --rotvid-only --json-out /tmp/j.json 2>&1 | grep "int8-fp8" | sort -u)
  done
done
PYTHONPATH=$PWD ROTVID_EXT_CACHE=/tmp/rext_$(basename $PWD) python3 -m pytest -q tests/kernels/test_cuda_int8fp8.py 2>&1 | tail -3
