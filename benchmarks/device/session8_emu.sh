# Device script (session 8): tuning build (-DROTVID_INT8FP8_VARIANTS); the int8-fp8 kernel with part of its
# exponentials on the FMA pipes (variants 14-16, 18) against the default (0) and a timing ceiling (17, wrong values),
# interleaved rounds at head_dim 128 and 64. Carry [".whl", ".peers"].
export ROTVID_EXT_CUDA_FLAGS=-DROTVID_INT8FP8_VARIANTS
source benchmarks/device/setup.sh
python3 benchmarks/device/int8fp8_variants.py --variants ${VARIANTS:-0,14,15,16,17,18,0,14,15,16,17,18} \
  --shapes ${SHAPES:-wan1.3b-480p wan14b-720p cogvideox5b} 2>&1 | tee $OUT/variants.txt
