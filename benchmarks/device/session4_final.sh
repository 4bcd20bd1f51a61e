# Device script (session 4): wheels + peer, default build, every GPU test, kernel_bench over all shapes with the
# peer (kernel_bench.json + markdown into $OUT). Carry [".whl", ".peers"]; set ROTVID_COMMIT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
mkdir -p /tmp/peers && tar -xzf .peers/sageattention2-*.tgz -C /tmp/peers && rm -rf /tmp/site/sageattention
export PYTHONPATH=$PYTHONPATH:/tmp/peers ROTVID_EXT_CACHE=/tmp/rext MAX_JOBS=16 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
python3 -c "from rotvid.kernels import cuda_backend as c; c.load_extension()" > $OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
python3 -m pytest -q -m gpu tests -rfs -p no:cacheprovider ${TEST_ARGS} 2>&1 | tee $OUT/gpu_tests.txt | tail -${TEST_TAIL:-12}
[ -n "$NO_BENCH" ] && exit 0
python3 benchmarks/kernel_bench.py --markdown-out $OUT/kernel_bench.md --json-out $OUT/kernel_bench.json ${BENCH_ARGS} > $OUT/bench_stdout.txt 2>&1
tail -45 $OUT/kernel_bench.md
