# Device script: A/B/C... of kernel sources on one machine. TREES: names of saved csrc trees under benchmarks/device/
# (ab_<name>/rotvid/kernels/csrc, untracked, prepared with git archive) plus "work" for the working tree; ROUNDS rounds
# (default 2) alternating the trees; each tree its own build cache; every tree uses the working tree's Python.
# CMD: another command to time in each tree (default: kernel_bench's INT4 attention-only rows at SHAPES).
set -e
trees=${TREES:-old work}
for name in $trees; do
  [ "$name" = work ] && continue
  test -d benchmarks/device/ab_$name/rotvid/kernels/csrc || { echo "benchmarks/device/ab_$name missing"; exit 1; }
  rm -rf /tmp/tree_$name && mkdir -p /tmp/tree_$name && cp -r rotvid benchmarks tests /tmp/tree_$name/
  rm -rf /tmp/tree_$name/rotvid/kernels/csrc && cp -r benchmarks/device/ab_$name/rotvid/kernels/csrc /tmp/tree_$name/rotvid/kernels/csrc
done
for round in $(seq ${ROUNDS:-2}); do
  for name in $trees; do
    dir=/tmp/tree_$name; [ "$name" = work ] && dir=$PWD
    echo "== $name round $round"
    if [ -n "$CMD" ]; then  # any other timing command, run in the tree's folder with its build
      (cd $dir && PYTHONPATH=$dir:$PYTHONPATH ROTVID_EXT_CACHE=/tmp/rext_$name bash -c "$CMD")
    else
      (cd $dir && PYTHONPATH=$dir ROTVID_EXT_CACHE=/tmp/rext_$name python3 benchmarks/kernel_bench.py \
        --shapes ${SHAPES:-wan1.3b-480p cogvideox5b} --no-sage --rotvid-only 2>&1 | grep "int4 \[wgmma\] (attn only)" | sort -u)
    fi
  done
done
