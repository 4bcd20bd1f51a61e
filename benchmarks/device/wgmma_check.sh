export PYTHONPATH=$PWD ROTVID_EXT_CACHE=/tmp/rext
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
time python3 -c "from rotvid.kernels import cuda_backend as c; c.load_extension()" > $OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
SO=$(find /tmp/rext -name "*.so" | head -1)
cuobjdump -sass -fun '_ZN6rotvid2wg27int4_attention_wgmma_kernelILi128ELi0EEEvNS_14Int4AttnParamsE14CUtensorMap_stS3_S3_' $SO > $OUT/sass_wgmma_d128.txt 2>&1
grep -oE "(IGMMA|HGMMA|QGMMA|WARPGROUP|UTMALDG|UBLKCP|SYNCS)[A-Z0-9._]*" $OUT/sass_wgmma_d128.txt | sort | uniq -c
python3 -m pytest -q -x tests/kernels/test_cuda_int4.py -k "wgmma" 2>&1 | tail -25
python3 benchmarks/kernel_bench.py --shapes wan1.3b-480p cogvideox5b --rotvid-only --also-s8 --no-sage --markdown-out $OUT/bench.md 2>&1 | tail -14
