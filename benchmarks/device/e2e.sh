# Device script (session 5): e2e_bench pieces, each appended to $OUT/e2e.md as soon as it ends (a later piece
# running out of time loses only itself). Carry [".whl", ".peers"]; set ROTVID_COMMIT.
# E2E_PIECES: ";"-separated e2e_bench argument lists (default: Wan2.1-1.3B eager, all rows).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
mkdir -p /tmp/peers && tar -xzf .peers/sageattention2-*.tgz -C /tmp/peers && rm -rf /tmp/site/sageattention
export PYTHONPATH=$PYTHONPATH:/tmp/peers ROTVID_EXT_CACHE=/tmp/rext MAX_JOBS=16 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
t0=$(date +%s)
python3 -c "from rotvid.kernels import cuda_backend as c; c.load_extension()" > $OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
[ -n "$TESTS" ] && python3 -m pytest -q -m gpu $TESTS -rfs -p no:cacheprovider 2>&1 | tee $OUT/gpu_tests.txt | tail -4
IFS=';' read -ra pieces <<< "${E2E_PIECES:---setups wan2.1-1.3b-480p --modes eager}"
for piece in "${pieces[@]}"; do
  t1=$(date +%s)
  python3 benchmarks/e2e_bench.py $piece --append $OUT/e2e.md > $OUT/e2e_stdout_$t1.txt 2>&1
  echo "piece [$piece] rc $? in $(( $(date +%s) - t1 )) s"; grep "^|" $OUT/e2e_stdout_$t1.txt | tail -8
done
