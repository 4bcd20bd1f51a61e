# Device script: the whole GPU test suite, then kernel_bench over every shape (appends to RESULTS.md copy in $OUT).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
export ROTVID_EXT_CACHE=/tmp/rext ROTVID_COMMIT=${ROTVID_COMMIT:-}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader
python3 -c "from rotvid.kernels import cuda_backend as c; c.load_extension()" > $OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
python3 -m pytest -q -m gpu tests -rs 2>&1 | tail -${TEST_TAIL:-8} | tee $OUT/gpu_tests.txt
python3 benchmarks/kernel_bench.py --also-s8 --markdown-out $OUT/kernel_bench.md ${BENCH_ARGS:-} > $OUT/bench_stdout.txt 2>&1
tail -45 $OUT/kernel_bench.md
