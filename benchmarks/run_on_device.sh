#!/usr/bin/env bash
# The device runner: everything a GPU machine does for rotvid, in one script, from the repository root.
#
#   bash benchmarks/run_on_device.sh [STEP ...]        # default steps: tests kernel
#
# Steps, run in the order given (a failing step is reported and the next one still runs; the exit status is
# that of the last failing step):
#   tests     the GPU test suite (pytest -m gpu; TESTS overrides the pytest arguments, TESTS_OUT the name of its
#             output file, default gpu_tests; ROTVID_TEST_GPUS=4 runs the NCCL tests on 4 GPUs)
#   kernel    benchmarks/kernel_bench.py over every shape, the peer and cuDNN in the same run (KERNEL_ARGS)
#   e2e       benchmarks/e2e_bench.py, compiled, both setups (E2E_ARGS replaces the default arguments)
#   parallel  benchmarks/parallel_bench.py, 1 and 2 GPUs (PARALLEL_ARGS; needs two GPUs); its JSON is
#             $OUT/parallel_bench.json, merged into a carried benchmarks/results/parallel_bench.json (same device, commit)
#   profile   benchmarks/e2e_profile.py (where a compiled forward's GPU time goes; PROFILE_ARGS)
#   power     benchmarks/sustained_power.py (attention isolated vs sustained, with SM clock and power; POWER_ARGS)
#   sanitize  benchmarks/sanitize_calls.py: compute-sanitizer racecheck, initcheck, synccheck and memcheck over small
#             dense and block-sparse calls of the Hopper kernels (int8-fp8, INT4; head_dim 64, 128) with and without
#             the tail split, and of the mma.sync kernels; one summary line per tool (SANITIZE_ARGS, e.g.
#             "--tools racecheck"; $COMPUTE_SANITIZER names the binary)
#   ab        kernel-source A/B on this one machine: kernel_bench's rotvid rows (attention with pre-processing,
#             KERNEL_ARGS, default --rotvid-only --no-sage --shapes wan1.3b-480p cogvideox5b) in AB_ROUNDS rounds
#             (default 2) alternating the working tree and a copy whose CUDA sources are AB_CSRC's: a saved
#             rotvid/kernels folder (its csrc/ and each recipe's recipes/<name>/csrc/ replace the copy's; e.g.
#             `git archive OLD rotvid/kernels | tar -x -C build/ab_old`, then AB_CSRC=build/ab_old/rotvid/kernels), or
#             a saved flat csrc folder of before the recipe folders (it replaces them all); or AB_TREE (a saved
#             rotvid/ of the old commit, for when the Python side differs too; this tree's benchmarks/ is used with
#             it); each tree has its own extension cache. Bits of every kernel configuration: benchmarks/skeleton_ab.py
#
# Before the steps it installs the carried wheels (./.whl/*.whl, e.g. diffusers; git-ignored), unpacks the
# SageAttention2 peer if one is carried (./.peers/sageattention2-*.tgz; git-ignored; never a dependency), prints
# the GPU, and builds the CUDA extension with one attention call (the build log is kept).
#
# Results and logs go under $OUT (default ./out, git-ignored): device.txt (GPU, clocks, commit, versions),
# build.log, run.log (every step's output), gpu_tests.txt, kernel_bench.md, kernel_bench.json, e2e.md,
# sanitize.md (+ sanitize_TOOL.log), and the other steps' tables. The extension is cached in ./build/ext
# (ROTVID_EXT_CACHE overrides it), so a second call on the same machine does not rebuild. ROTVID_COMMIT labels the results when the checkout's git history is
# not the commit that was measured.
set -uo pipefail

steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(tests kernel)
for step in "${steps[@]}"; do  # bad input stops here, before any slow work
  case $step in
    tests|kernel|e2e|parallel|profile|power|sanitize) ;;
    ab) [ -d "${AB_CSRC:-}" ] || [ -d "${AB_TREE:-}/rotvid" ] || { echo "run_on_device.sh: step ab needs AB_CSRC (a saved rotvid/kernels folder or csrc folder) or AB_TREE (a saved tree with rotvid/; got '${AB_CSRC:-}' / '${AB_TREE:-}')" >&2; exit 2; } ;;
    *) echo "run_on_device.sh: unknown step '$step' (expected: tests, kernel, e2e, parallel, profile, power, sanitize, ab)" >&2; exit 2 ;;
  esac
done

OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
SITE=${ROTVID_DEVICE_SITE:-$PWD/build/site}
export ROTVID_EXT_CACHE=${ROTVID_EXT_CACHE:-$PWD/build/ext}
export MAX_JOBS=${MAX_JOBS:-$(nproc)} PYTHONUNBUFFERED=1
# NVLink multicast stays off (shared hosts); torch.distributed respects these.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
LOG=$OUT/run.log
status=0

say() { echo "[run_on_device] $*" | tee -a "$LOG"; }

if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    || { say "installing .whl/*.whl failed"; exit 1; }
  export PYTHONPATH=$SITE:$PYTHONPATH
fi
if compgen -G ".peers/sageattention2-*.tgz" > /dev/null; then
  mkdir -p build/peers && tar -xzf .peers/sageattention2-*.tgz -C build/peers || { say "unpacking .peers failed"; exit 1; }
  rm -rf "$SITE/sageattention"  # the PyPI sageattention 1.0.6 would shadow the SageAttention2 build
  export PYTHONPATH=$PYTHONPATH:$PWD/build/peers
fi

{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
  echo "commit ${ROTVID_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  date -u '+%Y-%m-%d %H:%M UTC'
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
} | tee "$OUT/device.txt" | tee -a "$LOG"

t0=$(date +%s)
"$PY" - > "$OUT/build.log" 2>&1 <<'EOF' || { tail -40 "$OUT/build.log" | tee -a "$LOG"; say "extension build failed"; exit 1; }
import torch
import rotvid.kernels as kernels

q = torch.randn(1, 2, 256, 128, device="cuda", dtype=torch.bfloat16)
recipe = "int8-fp8" if torch.cuda.get_device_capability() >= (8, 9) else "int4"
kernels.attention(q, q, q, recipe=recipe, backend="cuda")  # first use builds the extension
torch.cuda.synchronize()
print(f"extension built and one {recipe} call ran")
EOF
say "build $(( $(date +%s) - t0 )) s"

run_step() {  # name, command...
  local name=$1; shift
  local t1; t1=$(date +%s)
  say "step $name: $*"
  "$@" >> "$LOG" 2>&1
  local rc=$?
  say "step $name: rc $rc in $(( $(date +%s) - t1 )) s"
  [ "$rc" -eq 0 ] || status=$rc
}

for step in "${steps[@]}"; do
  case $step in
    tests)
      # shellcheck disable=SC2086
      tests_out="$OUT/${TESTS_OUT:-gpu_tests}.txt"
      run_step tests bash -c "set -o pipefail; $PY -m pytest -q -rfs -p no:cacheprovider ${TESTS:--m gpu tests} 2>&1 | tee '$tests_out'"
      tail -1 "$tests_out" | tee -a "$LOG" ;;
    kernel)
      # shellcheck disable=SC2086
      run_step kernel "$PY" -m benchmarks.kernel_bench --markdown-out "$OUT/kernel_bench.md" \
        --json-out "$OUT/kernel_bench.json" ${KERNEL_ARGS:-} ;;
    e2e)
      # shellcheck disable=SC2086
      run_step e2e "$PY" -m benchmarks.e2e_bench ${E2E_ARGS:---modes compiled --rows sdpa,all,sage} \
        --append "$OUT/e2e.md" ;;
    parallel)
      [ -f benchmarks/results/parallel_bench.json ] && cp benchmarks/results/parallel_bench.json "$OUT/"
      # shellcheck disable=SC2086
      run_step parallel "$PY" -m benchmarks.parallel_bench --append "$OUT/parallel.md" \
        --json-out "$OUT/parallel_bench.json" ${PARALLEL_ARGS:-} ;;
    profile)
      run_step profile bash -c "$PY -m benchmarks.e2e_profile ${PROFILE_ARGS:-} > '$OUT/e2e_profile.txt' 2>&1" ;;
    power)
      run_step power bash -c "$PY -m benchmarks.sustained_power ${POWER_ARGS:-} > '$OUT/sustained_power.txt' 2>&1" ;;
    sanitize)
      # shellcheck disable=SC2086
      run_step sanitize "$PY" -m benchmarks.sanitize_calls --out "$OUT" ${SANITIZE_ARGS:-}
      [ -f "$OUT/sanitize.md" ] && tee -a "$LOG" < "$OUT/sanitize.md" ;;
    ab)
      rm -rf build/ab_tree && mkdir -p build/ab_tree
      if [ -n "${AB_TREE:-}" ]; then
        cp -r "$AB_TREE"/rotvid benchmarks build/ab_tree/  # this tree's kernel_bench.py and the modules it imports
      else
        kernels=build/ab_tree/rotvid/kernels
        cp -r rotvid benchmarks build/ab_tree/ && rm -rf "$kernels"/csrc "$kernels"/recipes/*/csrc
        if [ -d "$AB_CSRC/csrc" ]; then  # a saved kernels folder: the shared csrc/ and the recipes' csrc/
          cp -r "$AB_CSRC/csrc" "$kernels/csrc"
          for d in "$AB_CSRC"/recipes/*/csrc; do
            [ -d "$d" ] || continue
            r=$(basename "$(dirname "$d")")
            mkdir -p "$kernels/recipes/$r" && cp -r "$d" "$kernels/recipes/$r/csrc"
          done
        else  # a flat csrc folder (before the recipe folders): the build finds its files there alone
          cp -r "$AB_CSRC" "$kernels/csrc"
        fi
      fi
      for round in $(seq "${AB_ROUNDS:-2}"); do
        for tree in work ab_tree; do
          dir=$PWD; cache=$ROTVID_EXT_CACHE
          [ $tree = work ] || { dir=$PWD/build/ab_tree; cache=$ROTVID_EXT_CACHE-ab; }
          # shellcheck disable=SC2086
          run_step "ab $tree round $round" env -C "$dir" PYTHONPATH="$dir:$PYTHONPATH" ROTVID_EXT_CACHE="$cache" \
            "$PY" -m benchmarks.kernel_bench ${KERNEL_ARGS:---rotvid-only --no-sage --shapes wan1.3b-480p cogvideox5b} \
            --markdown-out "$OUT/ab_${tree}_$round.md"
        done
      done ;;
  esac
done
say "done, exit status $status; results in $OUT"
exit $status
