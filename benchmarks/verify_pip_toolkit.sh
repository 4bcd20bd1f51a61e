#!/usr/bin/env bash
# Issue 44 on a GPU machine: the kernels built by the pip-installed CUDA compiler (`rotvid[cuda]`) with the system
# toolkit out of reach, beside the system-toolkit build in the same run.
#
#   bash benchmarks/verify_pip_toolkit.sh [STEP ...]     # default steps: install system pip
#
# Steps:
#   install  keeps the carried wheels (./.whl/*.whl, git-ignored) in ./build/pip-wheels (git-ignored, kept between
#            calls on a warm machine) and, once the set is complete, pip-installs the `cuda` extra's requirement as
#            pyproject.toml writes it (`cuda-toolkit[nvcc,cccl]>=13,<14`) from those wheels alone into a fresh
#            $TOOLKIT (default ./build/pip-toolkit), leaving the environment's own packages alone. The wheels are about
#            100 MiB, over one call's 64 MiB of carried files: carry them in two calls that each run `install`, the
#            second one with the other steps. For torch 2.13 (CUDA 13.0, which pins `cuda-toolkit==13.0.3`):
#              call 1: nvidia_nvvm-13.0.88-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl         58.7 MiB
#              call 2: nvidia_cuda_nvcc-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl    35.7 MiB
#                      nvidia_cuda_cccl-13.0.85-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl     3.0 MiB
#                      nvidia_cuda_runtime-13.0.96-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl  2.1 MiB
#                      nvidia_cuda_crt-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl      0.1 MiB
#                      cuda_toolkit-13.0.3.0-py2.py3-none-any.whl                                           2.5 KiB
#            (`pip download --no-deps -d .whl nvidia-nvvm==13.0.88` and so on, on a machine that reaches PyPI.)
#   system   the reference: `rotvid build` with the system toolkit (ROTVID_NVCC=system) into its own cache, then the
#            kernel_bench shape; skipped with a note when the machine has no system toolkit.
#   pip      the system toolkit hidden: no nvcc on PATH (toolkit bin folders dropped, a wrapper nvcc masked),
#            CUDA_HOME / CUDA_PATH unset, ROTVID_NVCC=pip (the loader takes only the pip packages) and, where this
#            shell may (root and `unshare`), /usr/local/cuda* covered by an empty folder in a private mount namespace;
#            then `rotvid backends` (the compiler line), `rotvid build` into a fresh cache (timed), the GPU kernel
#            tests (VERIFY_TESTS, default tests/kernels) and the same kernel_bench shape.
#
# Results go under $OUT (default ./out/pip_toolkit): device.txt, <step>.log, kernel_bench_<step>.md, summary.txt.
set -uo pipefail

steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(install system pip)
for step in "${steps[@]}"; do
  case $step in install|system|pip|_pip_hidden) ;;
    *) echo "verify_pip_toolkit.sh: unknown step '$step' (expected: install, system, pip)" >&2; exit 2 ;;
  esac
done

OUT=${OUT:-$PWD/out/pip_toolkit}
mkdir -p "$OUT"
TOOLKIT=${TOOLKIT:-$PWD/build/pip-toolkit}
WHEELS=$PWD/build/pip-wheels
PY=$(command -v "${PYTHON:-python3}") || { echo "verify_pip_toolkit.sh: no ${PYTHON:-python3}" >&2; exit 2; }
SHAPE_ARGS=(--shapes wan1.3b-480p --rotvid-only --no-sage)
export MAX_JOBS=${MAX_JOBS:-$(nproc)} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
SUMMARY=$OUT/summary.txt
status=0

say() { echo "[verify_pip_toolkit] $*" | tee -a "$SUMMARY"; }

timed() {  # name, command...: runs it, its output to $OUT/name.log and the screen, says its time and status
  local name=$1; shift
  local t0=$SECONDS
  "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  say "$name: rc $rc in $(( SECONDS - t0 )) s"
  [ "$rc" -eq 0 ] || status=$rc
  return "$rc"
}

path_without_nvcc() {  # PATH less every toolkit bin folder; a folder with only a wrapper nvcc gets a masked copy
  local mask out="" d f
  mask=$(mktemp -d)
  IFS=: read -ra dirs <<< "$PATH"
  for d in "${dirs[@]}"; do
    [ -n "$d" ] && [ -d "$d" ] || continue
    if [ ! -e "$d/nvcc" ]; then out+=":$d"; continue; fi
    { [ -e "$d/ptxas" ] || [ -e "$d/nvcc.profile" ]; } && continue  # a toolkit's bin: drop it
    mkdir -p "$mask/${#out}"
    for f in "$d"/*; do [ "$(basename "$f")" = nvcc ] || ln -s "$f" "$mask/${#out}/"; done
    out+=":$mask/${#out}"
  done
  echo "${out#:}"
}

hidden_step() {  # the pip step's body, in an environment that cannot see the system toolkit
  PATH=$(path_without_nvcc)
  export PATH
  unset CUDA_HOME CUDA_PATH PYTORCH_NVCC
  export ROTVID_NVCC=pip PYTHONPATH=$TOOLKIT:$PYTHONPATH ROTVID_EXT_CACHE=$PWD/build/ext-pip-toolkit
  rm -rf "$ROTVID_EXT_CACHE"
  {
    echo "nvcc on PATH: $(command -v nvcc || echo none)"
    echo "CUDA_HOME: ${CUDA_HOME:-unset}, ROTVID_NVCC=$ROTVID_NVCC"
    for d in /usr/local/cuda*; do
      [ -e "$d" ] && echo "$d/bin/nvcc: $( [ -e "$d/bin/nvcc" ] && echo REACHABLE || echo out of reach)"
    done
  } | tee -a "$SUMMARY"
  timed pip_backends "$PY" -m rotvid.cli backends
  grep '^compiler' "$OUT/pip_backends.log" | tee -a "$SUMMARY"
  timed pip_build "$PY" -m rotvid.cli build || return
  grep -E '^(compiler|built|up to date)' "$OUT/pip_build.log" | tee -a "$SUMMARY"
  # shellcheck disable=SC2086
  timed pip_gpu_tests "$PY" -m pytest -q -p no:cacheprovider -m gpu ${VERIFY_TESTS:-tests/kernels} -x
  tail -1 "$OUT/pip_gpu_tests.log" | tee -a "$SUMMARY"
  timed pip_kernel_bench "$PY" -m benchmarks.kernel_bench "${SHAPE_ARGS[@]}" --markdown-out "$OUT/kernel_bench_pip.md"
}

[ "${steps[0]}" = _pip_hidden ] || {
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  echo "commit ${ROTVID_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  date -u '+%Y-%m-%d %H:%M UTC'
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'driver', torch._C._cuda_getDriverVersion())"
  echo "MAX_JOBS $MAX_JOBS, $(nproc) cores"
} | tee "$OUT/device.txt" | tee -a "$SUMMARY"

for step in "${steps[@]}"; do
  case $step in
    install)
      mkdir -p "$WHEELS"
      if compgen -G ".whl/*.whl" > /dev/null; then cp .whl/*.whl "$WHEELS/"; fi
      ls -l "$WHEELS" | tee -a "$SUMMARY"
      missing=""
      for w in cuda_toolkit nvidia_cuda_nvcc nvidia_nvvm nvidia_cuda_crt nvidia_cuda_runtime nvidia_cuda_cccl; do
        compgen -G "$WHEELS/$w-*.whl" > /dev/null || missing+=" $w"
      done
      if [ -n "$missing" ]; then say "install: kept the carried wheels; still missing:$missing"; continue; fi
      req=$("$PY" - <<'EOF'
import re
text = open("pyproject.toml", encoding="utf-8").read()
try:
    import tomllib
    req = tomllib.loads(text)["project"]["optional-dependencies"]["cuda"][0]
except ImportError:  # Python 3.10
    req = re.search(r'^cuda = \["(.+?)"\]', text, re.M).group(1).replace('\\"', '"')
print(req.split(";")[0].strip())
EOF
)
      say "install: pip install --no-index --find-links $WHEELS --target $TOOLKIT '$req' (the cuda extra)"
      rm -rf "$TOOLKIT"
      timed install "$PY" -m pip install -q --no-index --find-links "$WHEELS" --no-compile --no-cache-dir \
        --target "$TOOLKIT" "$req"
      ls -d "$TOOLKIT"/*.dist-info | tee -a "$SUMMARY" ;;
    system)
      if ! ROTVID_NVCC=system "$PY" -c "from rotvid.kernels import cuda_toolkit as t; print(t.find_toolkit().describe())" \
          > "$OUT/system_compiler.txt" 2>&1; then
        say "system: no system toolkit usable ($(tail -1 "$OUT/system_compiler.txt")); skipped"
        continue
      fi
      say "system compiler: $(cat "$OUT/system_compiler.txt")"
      ROTVID_NVCC=system ROTVID_EXT_CACHE=$PWD/build/ext-system-toolkit timed system_build "$PY" -m rotvid.cli build
      grep -E '^(built|up to date)' "$OUT/system_build.log" | tee -a "$SUMMARY"
      ROTVID_NVCC=system ROTVID_EXT_CACHE=$PWD/build/ext-system-toolkit timed system_kernel_bench "$PY" \
        -m benchmarks.kernel_bench "${SHAPE_ARGS[@]}" --markdown-out "$OUT/kernel_bench_system.md" ;;
    pip)
      if [ ! -x "$TOOLKIT/nvidia/cu13/bin/nvcc" ] || [ ! -x "$TOOLKIT/nvidia/cu13/nvvm/bin/cicc" ]; then
        say "pip: $TOOLKIT lacks nvcc or cicc (run the install step with the wheels above first)"; status=1; continue
      fi
      if [ "$(id -u)" = 0 ] && command -v unshare > /dev/null \
          && unshare -m --propagation private true 2> /dev/null; then
        say "pip: /usr/local/cuda* covered by an empty folder in a private mount namespace"
        OUT=$OUT TOOLKIT=$TOOLKIT PYTHON=$PY unshare -m --propagation private bash -c '
          empty=$(mktemp -d)
          for d in /usr/local/cuda*; do [ -d "$d" ] && mount --bind "$empty" "$d"; done
          exec bash "$0" _pip_hidden' "$0"
        rc=$?
      else
        say "pip: cannot unshare a mount namespace here; ROTVID_NVCC=pip keeps the loader off the system toolkit"
        OUT=$OUT TOOLKIT=$TOOLKIT PYTHON=$PY bash "$0" _pip_hidden
        rc=$?
      fi
      [ "$rc" -eq 0 ] || status=$rc ;;
    _pip_hidden)
      hidden_step
      exit $status ;;
  esac
done

for f in system pip; do
  [ -f "$OUT/kernel_bench_$f.md" ] && { echo "--- kernel_bench, $f toolkit"; cat "$OUT/kernel_bench_$f.md"; } | tee -a "$SUMMARY"
done
say "done, exit status $status; results in $OUT"
exit $status
