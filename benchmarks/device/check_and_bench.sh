# Device script: default build, kernel tests (wgmma + pre-processing), pre-processing breakdown, kernel_bench.
export PYTHONPATH=$PWD ROTVID_EXT_CACHE=/tmp/rext
python3 -c "from rotvid.kernels import cuda_backend as c; c.load_extension()" > $OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
python3 -m pytest -q tests/kernels/test_cuda_int4.py -k "${TESTS:-wgmma or preprocess}" 2>&1 | tail -6
python3 benchmarks/device/pre_profile.py 2>&1 | tail -14
python3 benchmarks/kernel_bench.py --shapes ${SHAPES:-wan1.3b-480p cogvideox5b} ${BENCH_ARGS:---rotvid-only --also-s8 --no-sage} --markdown-out $OUT/bench.md 2>&1 | tail -${BENCH_TAIL:-16}
