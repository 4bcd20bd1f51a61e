# Device script: A/B of the wgmma kernel between saved sources and the working tree, on one machine (ROUNDS, default
# two, alternating old / new).
# Before the call: git archive <rev> rotvid/kernels/csrc | tar -x -C benchmarks/device/ab_old   (untracked; it
# travels with the working tree). Build caches are separate; both trees use the working tree's Python.
set -e
test -d benchmarks/device/ab_old/rotvid/kernels/csrc || { echo "benchmarks/device/ab_old/rotvid/kernels/csrc missing"; exit 1; }
rm -rf /tmp/old && mkdir -p /tmp/old && cp -r rotvid benchmarks tests /tmp/old/
rm -rf /tmp/old/rotvid/kernels/csrc && cp -r benchmarks/device/ab_old/rotvid/kernels/csrc /tmp/old/rotvid/kernels/csrc
for round in $(seq ${ROUNDS:-2}); do
  for tree in /tmp/old $PWD; do
    echo "== $tree round $round"
    (cd $tree && PYTHONPATH=$tree ROTVID_EXT_CACHE=/tmp/rext_$(basename $tree) python3 benchmarks/kernel_bench.py \
      --shapes ${SHAPES:-wan1.3b-480p cogvideox5b} --no-sage --rotvid-only 2>&1 | grep "wgmma\] (attn only)" | grep -v sym)
  done
done
