# Device script (session 3): default build, the kernel GPU tests, the pre-processing breakdown, then a tuning build
# with the wgmma variants (VARIANTS) at the Wan2.1-1.3B and CogVideoX-5B shapes, and (PROFILE=1) an Nsight
# Compute source-level profile of the default kernel at Wan2.1-1.3B.
export PYTHONPATH=${PYTHONPATH:-$PWD} ROTVID_EXT_CACHE=/tmp/rext
python3 -c "from rotvid.kernels import cuda_backend as c; c.load_extension()" > $OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
python3 -m pytest -q ${TEST_PATHS:-tests/kernels/test_cuda_int4.py} -m gpu 2>&1 | tail -${TEST_TAIL:-4}
python3 benchmarks/device/pre_profile.py 2>&1 | grep -E "rotvid|elementwise|fill|Self CUDA time"
if [ -n "$VARIANTS" ]; then
  ROTVID_EXT_CUDA_FLAGS=-DROTVID_WGMMA_VARIANTS python3 -c "from rotvid.kernels import cuda_backend as c; c.load_extension()" > $OUT/build_var.log 2>&1 || { tail -20 $OUT/build_var.log; exit 1; }
  ROTVID_EXT_CUDA_FLAGS=-DROTVID_WGMMA_VARIANTS python3 benchmarks/kernel_variants.py --var ROTVID_WGMMA_VARIANT=$VARIANTS --shapes ${VSHAPES:-wan1.3b-480p cogvideox5b} 2>&1 | tail -14
fi
if [ -n "$PROFILE" ]; then
  bash benchmarks/device/wgmma_profile.sh
fi
