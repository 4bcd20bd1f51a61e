# Device script (session 4): default build, the int8-fp8 + INT4 wgmma GPU tests, kernel_bench with the peer.
# Carry [".peers"] (the SageAttention2 binary, ../shared/peers/README.md). Env: TESTS (pytest -k), SHAPES.
export PYTHONPATH=$PWD ROTVID_EXT_CACHE=/tmp/rext MAX_JOBS=16 PYTHONUNBUFFERED=1
# (the device copy may carry a stale .git: name the commit in ROTVID_COMMIT)
if ls .peers/sageattention2-*.tgz >/dev/null 2>&1; then
  mkdir -p /tmp/peers && tar -xzf .peers/sageattention2-*.tgz -C /tmp/peers && rm -rf /tmp/site/sageattention
  export PYTHONPATH=$PYTHONPATH:/tmp/peers
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
t0=$(date +%s)
python3 -c "from rotvid.kernels import cuda_backend as c; c.load_extension()" > $OUT/build.log 2>&1 || { tail -60 $OUT/build.log; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
python3 -m pytest -q -x tests/kernels/test_cuda_int8fp8.py ${EXTRA_TESTS} -k "${TESTS:-.}" 2>&1 | tee $OUT/tests.log | tail -${TEST_TAIL:-25}
[ -n "$NO_BENCH" ] && exit 0
python3 benchmarks/kernel_bench.py --shapes ${SHAPES:-wan1.3b-480p wan14b-480p wan14b-720p hunyuan-720p cogvideox5b} \
  ${BENCH_ARGS} --markdown-out $OUT/bench.md --json-out $OUT/kernel_bench.json 2>&1 | tail -${BENCH_TAIL:-60}
