# Device script: tuning build of the wgmma kernel, variant timings, and an Nsight Compute profile.
export PYTHONPATH=$PWD ROTVID_EXT_CACHE=/tmp/rext ROTVID_EXT_CUDA_FLAGS=-DROTVID_WGMMA_VARIANTS
python3 -c "from rotvid.kernels import cuda_backend as c; c.load_extension()" > $OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
python3 benchmarks/kernel_variants.py --var ROTVID_WGMMA_VARIANT=${VARIANTS:-0,1,2,3,4,5,6,7} --shapes wan1.3b-480p cogvideox5b ${VARIANT_ARGS:-} 2>&1 | tail -22
if [ -n "$PROFILE" ]; then
  bash benchmarks/device/wgmma_profile.sh
fi
if [ -n "$TESTS" ]; then
  unset ROTVID_EXT_CUDA_FLAGS
  python3 -m pytest -q -x tests/kernels/test_cuda_int4.py -k "$TESTS" 2>&1 | tail -15
fi
if [ -n "$SASS" ]; then
  SO=$(find /tmp/rext -name "*.so" | head -1)
  for f in $(cuobjdump -sass $SO | grep -oE "Function : \S+wgmma\S+" | awk '{print $3}' | sort -u); do
    n=$(cuobjdump -sass -fun $f $SO | grep -oE "\bR[0-9]+\b" | sed 's/R//' | sort -n | tail -1)
    l=$(cuobjdump -sass -fun $f $SO | grep -cE "LDL|STL")
    echo "$f maxreg=R$n local=$l"
  done 2>/dev/null | sed 's/_ZN6rotvid2wg27int4_attention_wgmma_kernelI//;s/EEEvNS.*maxreg/ maxreg/' > $OUT/sass_regs.txt
  F=$(cuobjdump -sass $SO | grep -oE "Function : \S+wgmma_kernelILi128ELi0ELi2ELb0ELi1\S+" | awk '{print $3}' | head -1)
  cuobjdump -sass -fun $F $SO > $OUT/sass_d128.txt 2>/dev/null
fi
