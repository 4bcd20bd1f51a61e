# Device script (session 6): tuning build of the int8-fp8 kernel, the PIPE 2 variants (QK^T of the next block
# issued before P.V, its row max taken while P.V runs) against the default, the int8-fp8 GPU tests on variant
# $TEST_VARIANT, and the SASS of the default kernels. Carry [".whl", ".peers"].
export ROTVID_EXT_CUDA_FLAGS=-DROTVID_INT8FP8_VARIANTS
source benchmarks/device/setup.sh
(cuobjdump -sass /tmp/rext/*/*.so 2>/dev/null || true) > $OUT/sass.txt
ROTVID_INT8FP8_VARIANT=${TEST_VARIANT:-10} python3 -m pytest -q -m gpu tests/kernels/test_cuda_int8fp8.py -rfs -p no:cacheprovider 2>&1 | tail -4
python3 benchmarks/device/int8fp8_variants.py --variants ${VARIANTS:-1,10,11,12,13,1,10} --shapes ${SHAPES:-cogvideox5b wan1.3b-480p wan14b-720p} 2>&1 | tee $OUT/variants.txt
python3 benchmarks/kernel_bench.py --shapes cogvideox5b --markdown-out $OUT/kb.md --json-out $OUT/kb.json > $OUT/kb_stdout.txt 2>&1; tail -12 $OUT/kb.md
