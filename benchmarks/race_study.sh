#!/usr/bin/env bash
# The Hopper kernel's racecheck hazards, studied on one GPU in one call (a device call of ~8 minutes):
#
#   bash benchmarks/race_study.sh            # results under $OUT (default ./out): race_study.md + logs
#
# 1. builds three extensions in parallel, one per way the consumers hand a stage back to the producer
#    (ROTVID_HOPPER_RELEASE 0 = each warp's lane 0 arrives after __syncwarp, 1 = every consumer thread arrives (the
#    shipped one), 2 = a named barrier per warpgroup, then one arrival; hopper_attention.cuh);
# 2. runs racecheck over the Hopper (wgmma) calls of benchmarks/sanitize_calls.py under each;
# 3. runs initcheck over a few calls twice, with the usual kernel filter (rotvid's kernels only) and with
#    --all-kernels (torch's kernels instrumented too, so their writes count as initialisation);
# 4. times the three builds (benchmarks/kernel_variants.py: attention only, against cuDNN in the same child; the
#    output bits compared with the first build's), int8-fp8 and INT4, head_dim 64 and 128.
# First run (H200, 2be06ad): racecheck 77,625 hazards under 0 and 2, none under 1; initcheck 44,769 reports with
# the filter (every one a read of kv_lens, which a torch kernel wrote: torch's kernels are not instrumented then),
# 0 with --all-kernels; int8-fp8 within 1% under all three.
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
BASE=${ROTVID_EXT_CACHE:-$PWD/build/ext}
ROUNDS=${RACE_ROUNDS:-3}
SUMMARY=$OUT/race_study.md
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

cache_of() { echo "$BASE/hopper-schedule-def-ROTVID_HOPPER_RELEASE-$1"; }
flags_of() { echo "-DROTVID_HOPPER_RELEASE=$1"; }

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$SUMMARY"
note "commit ${ROTVID_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"
start=$(date +%s)
for v in 0 1 2; do
  ( ROTVID_EXT_CACHE=$(cache_of $v) ROTVID_EXT_CUDA_FLAGS="$(flags_of $v)" MAX_JOBS=$(( $(nproc) / 3 + 1 )) \
      "$PY" -c "from rotvid.kernels import cuda_build; cuda_build.load_extension()" > "$OUT/build_$v.log" 2>&1 \
      || echo "build $v failed" >> "$OUT/build_$v.log" ) &
done
wait
note "builds: $(( $(date +%s) - start )) s"
grep -l failed "$OUT"/build_*.log && { tail -30 "$OUT"/build_*.log; exit 1; }

note '```'
for v in 0 1 2; do
  ROTVID_EXT_CACHE=$(cache_of $v) ROTVID_EXT_CUDA_FLAGS="$(flags_of $v)" \
    "$PY" -m benchmarks.sanitize_calls --tools racecheck --match wgmma --out "$OUT/race_$v" > /dev/null 2>&1
  note "release $v: $(cat "$OUT/race_$v/sanitize.md" | grep racecheck)"
done
ROTVID_EXT_CACHE=$(cache_of 1) ROTVID_EXT_CUDA_FLAGS="$(flags_of 1)" "$PY" -m benchmarks.sanitize_calls \
  --tools initcheck --match 'wgmma d64 dense' --rotvid-kernels-only --out "$OUT/init_filtered" > /dev/null 2>&1
note "initcheck, rotvid's kernels only: $(grep initcheck "$OUT/init_filtered/sanitize.md")"
ROTVID_EXT_CACHE=$(cache_of 1) ROTVID_EXT_CUDA_FLAGS="$(flags_of 1)" "$PY" -m benchmarks.sanitize_calls \
  --tools initcheck --match 'wgmma d64 dense' --out "$OUT/init_all" > /dev/null 2>&1
note "initcheck, all kernels:         $(grep initcheck "$OUT/init_all/sanitize.md")"
note '```'
grep -m3 -A6 "Uninitialized" "$OUT/init_filtered/sanitize_initcheck.log" > "$OUT/init_first.txt"

for recipe in int8-fp8 int4; do
  ROTVID_EXT_CACHE=$BASE "$PY" -m benchmarks.kernel_variants --recipe "$recipe" --rounds "$ROUNDS" \
    --schedules def:ROTVID_HOPPER_RELEASE=0 def:ROTVID_HOPPER_RELEASE=1 def:ROTVID_HOPPER_RELEASE=2 \
    --shapes cogvideox5b wan1.3b-480p wan14b-720p 2>&1 | tee "$OUT/variants_$recipe.log" | sed -n '/^|/p;/attention only/p' \
    | tee -a "$SUMMARY"
done
note "total: $(( $(date +%s) - start )) s"
