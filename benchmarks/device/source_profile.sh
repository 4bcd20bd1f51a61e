# Device script (session 9): where the int8-fp8 wgmma kernel's warps stall, per SASS instruction. One call at a
# kernel_bench shape under ncu with the SourceCounters section (warp-state sampling), exported as a per-instruction
# CSV ($OUT/source_<shape>.csv: each SASS instruction with its samples per stall reason). Carry [".whl", ".peers"].
source benchmarks/device/setup.sh
for shape in ${PROFILE_SHAPES:-wan1.3b-480p}; do
  timeout 240 ncu --clock-control none -k regex:${PROFILE_KERNEL:-int8fp8_attention} -c 1 --section SourceCounters \
    --section WarpStateStats --import-source no -o $OUT/prof_$shape python3 benchmarks/device/one_call.py $shape \
    > $OUT/ncu_$shape.log 2>&1; echo "ncu $shape rc $?"
  ncu -i $OUT/prof_$shape.ncu-rep --page source --csv --print-source sass > $OUT/source_$shape.csv 2>$OUT/source_$shape.err
  echo "csv $(wc -l < $OUT/source_$shape.csv) lines"; head -3 $OUT/source_$shape.csv | cut -c1-600
  ncu -i $OUT/prof_$shape.ncu-rep --page details --section WarpStateStats --section SourceCounters > $OUT/details_$shape.txt 2>&1
  grep -iE "stall|warp cycles" $OUT/details_$shape.txt | head -30
done
