# Device script (session 6): wheels + peer, default build, every GPU test, the int8-fp8 pre-processing A/B (fused vs
# ROTVID_PRE_LEGACY=1), kernel_bench over all shapes with the peer (kernel_bench.json + markdown into $OUT).
# Carry [".whl", ".peers"]; set ROTVID_COMMIT.
source benchmarks/device/setup.sh
python3 -m pytest -q -m gpu tests -rfs -p no:cacheprovider ${TEST_ARGS} 2>&1 | tee $OUT/gpu_tests.txt | tail -${TEST_TAIL:-15}
python3 benchmarks/device/pre_int8fp8_time.py 2>&1 | tee $OUT/pre_time.txt | tail -12
[ -n "$NO_BENCH" ] && exit 0
python3 benchmarks/kernel_bench.py --markdown-out $OUT/kernel_bench.md --json-out $OUT/kernel_bench.json ${BENCH_ARGS} > $OUT/bench_stdout.txt 2>&1
tail -45 $OUT/kernel_bench.md
