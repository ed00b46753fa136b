#!/usr/bin/env bash
# One-shot GPU check (issue 6): on a GPU machine, build ringtree with CUDA into a fresh build
# directory, run the GPU tests and the quick CPU schedule suite, then the GPU bench. Every stage
# has its own time limit and the whole run stays under a global budget (default 450 s); a failing
# stage is reported and the next one still runs. Logs go to $OUT (default ./gpu-logs).
#
#   OUT=/path/to/logs bash bench/gpu_check.sh
#
# Settings: PYTHON (default /opt/torch/.venv/bin/python3, else python3), BUILD_DIR (default
# build/gpu-check), KEEP_BUILD=1 (reuse BUILD_DIR instead of starting fresh), CHECK_BUDGET
# (seconds, default 450), CMAKE_CUDA_ARCHITECTURES (default 90), BENCH_ARGS (extra bench flags).
set -u
set -x
START=$(date +%s)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
OUT=${OUT:-$ROOT/gpu-logs}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BUDGET=${CHECK_BUDGET:-450}
JOBS=$(nproc 2>/dev/null || echo 4)
BUILD=${BUILD_DIR:-$ROOT/build/gpu-check}
ARCH=${CMAKE_CUDA_ARCHITECTURES:-90}

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for c in /opt/torch/.venv/bin/python3 python3; do
    if command -v "$c" >/dev/null 2>&1; then PY=$(command -v "$c"); break; fi
  done
fi
# The venv's bin holds cmake, ninja and pytest when they came from pip.
export PATH="$(dirname "$PY"):$PATH"
if ! command -v nvcc >/dev/null 2>&1; then
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin $("$PY" -c 'import glob, site; print(" ".join(glob.glob(site.getsitepackages()[0] + "/nvidia/*/bin")))' 2>/dev/null); do
    if [ -x "$d/nvcc" ]; then export PATH="$d:$PATH"; break; fi
  done
fi

declare -a NAMES=()
declare -A RESULT=()

# stage NAME LIMIT_SECONDS CMD...: runs CMD with its output in $OUT/NAME.log, within both its own
# limit and what is left of the global budget; records and prints the outcome and the log's tail.
stage() {
  local name=$1 limit=$2
  shift 2
  local log="$OUT/$name.log" now left t0 rc
  now=$(date +%s)
  left=$((BUDGET - (now - START)))
  if [ "$left" -lt 15 ]; then
    NAMES+=("$name"); RESULT[$name]="SKIPPED (global budget of ${BUDGET}s used up)"
    echo "==== $name: skipped, budget used up" | tee "$log"
    return 124
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "==== $name (limit ${limit}s): $*"
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  rc=$?
  local dur=$(($(date +%s) - t0))
  NAMES+=("$name")
  if [ "$rc" -eq 0 ]; then RESULT[$name]="ok (${dur}s)"
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then RESULT[$name]="TIMED OUT after ${dur}s (rc=$rc)"
  else RESULT[$name]="FAILED rc=$rc (${dur}s)"; fi
  echo "---- $name: ${RESULT[$name]}; tail of $log:"
  tail -n 40 "$log"
  return $rc
}

env_report() {
  nvidia-smi
  echo "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 1)"
  echo "python: $PY"
  "$PY" --version
  command -v nvcc && nvcc --version
  command -v cmake && cmake --version | head -1
  command -v ninja && ninja --version
  "$PY" - <<'EOF'
import importlib
for name in ("torch", "cupy", "numpy", "pybind11", "pytest"):
    try:
        m = importlib.import_module(name)
        extra = ""
        if name == "torch":
            extra = f" cuda={m.version.cuda} available={m.cuda.is_available()} devices={m.cuda.device_count()}"
        print(f"{name} {getattr(m, '__version__', '?')}{extra}")
    except Exception as e:  # noqa: BLE001
        print(f"{name}: not importable ({e})")
EOF
}

configure() {
  local gen=()
  command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
  cmake -S "$ROOT" -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DRINGTREE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DPython_EXECUTABLE="$PY" \
    -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)"
}

# The package as tests import it: python/ringtree plus the freshly built _core, in $BUILD/site.
stage_package() {
  rm -rf "$BUILD/site" && mkdir -p "$BUILD/site" || return 1
  cp -r "$ROOT/python/ringtree" "$BUILD/site/" || return 1
  rm -f "$BUILD"/site/ringtree/_core*.so
  cp "$BUILD"/_core*.so "$BUILD/site/ringtree/" || return 1
  "$PY" -c 'import ringtree, ringtree._core as c; print(c.__file__); print("cuda_built", c.cuda_built(), "cuda_available", c.cuda_available(), c.cuda_unavailable_reason())'
}

# timeout(1) runs programs, not shell functions: export them (and what they read) for bash -c.
export ROOT BUILD PY ARCH
export -f env_report configure stage_package

if [ "${KEEP_BUILD:-0}" != "1" ]; then rm -rf "$BUILD"; fi
export PYTHONPATH="$BUILD/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1

stage env 30 bash -c env_report
stage configure 90 bash -c configure
stage build 240 cmake --build "$BUILD" -j "$JOBS"
stage package 30 bash -c stage_package
# The multi-process device path first: it has never run on a GPU (the thread-rank executor of
# tests/gpu/test_gpu.py has); with it, its host side (gates, CUDA arrays, NCCL loading), which the
# suite keeps apart by kind. Later stages are skipped, and say so, once the global budget is spent.
DEVICE_TESTS=(tests/gpu/test_device_comm.py tests/multiproc/test_device_comm_host.py
              tests/unit/test_cuda_array_interface.py tests/unit/test_nccl_loading.py)
stage device_tests 240 "$PY" -m pytest "${DEVICE_TESTS[@]}" -v -rs -p no:cacheprovider
stage walker_tests 30 "$PY" -m pytest -q tests/unit/test_step_walker.py -p no:cacheprovider
# The nccl-tests sweep on CUDA buffers across processes sharing the GPU: the IPC executor at 2
# ranks (next to a device-to-device copy; NCCL refuses two ranks on one GPU and says so).
RTB=(bench/rt_bench.py --device cuda --no-progress --collective all_reduce,all_gather,broadcast)
stage rt_bench_ipc2 45 "$PY" -m ringtree.launch -n 2 --timeout 40 "${RTB[@]}" -b 8 -e 64M -f 16 --vs nccl,memcpy
stage gpu_tests 120 "$PY" -m pytest tests/gpu/test_gpu.py -v -rs -p no:cacheprovider
# 4 ranks, the staged path, and one rank next to NCCL (which needs one GPU per rank).
stage rt_bench_ipc4 45 "$PY" -m ringtree.launch -n 4 --timeout 40 "${RTB[@]}" -b 4K -e 64M -f 16 --vs memcpy
stage rt_bench_staged 40 env RINGTREE_CUDA_IPC=0 "$PY" -m ringtree.launch -n 2 --timeout 35 "${RTB[@]}" -b 4K -e 16M -f 64
stage rt_bench_nccl1 40 "$PY" -m ringtree.launch -n 1 --timeout 35 "${RTB[@]}" -b 8 -e 64M -f 64 --vs nccl,memcpy
# shellcheck disable=SC2086
stage bench 90 "$PY" bench/gpu_bench.py ${BENCH_ARGS:-}
stage cpu_schedules 60 "$PY" -m pytest -q tests/unit/test_schedules.py -p no:cacheprovider

set +x
{
  echo "==================== gpu_check summary ($(date -u +%FT%TZ), $(($(date +%s) - START))s total) ===================="
  echo "repo: $ROOT  ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null) + working tree)  build: $BUILD  logs: $OUT"
  for n in "${NAMES[@]}"; do printf '  %-14s %s\n' "$n" "${RESULT[$n]}"; done
  echo "-- device:"; grep -m1 '^GPU:' "$OUT/env.log" 2>/dev/null | sed 's/^/   /'
  echo "-- tests:"
  for t in gpu_tests device_tests walker_tests cpu_schedules; do
    [ -f "$OUT/$t.log" ] && printf '   %-14s %s\n' "$t" "$(grep -E '(passed|failed|error|skipped)' "$OUT/$t.log" | tail -n 1)"
  done
  grep -hE '^(FAILED|ERROR) ' "$OUT/gpu_tests.log" "$OUT/device_tests.log" 2>/dev/null | head -n 20 | sed 's/^/   /'
  echo "-- bench (largest all_reduce per P/algo):"
  grep -E '^#   P=|^# verification|NCCL' "$OUT/bench.log" 2>/dev/null | sed 's/^/   /'
  echo "-- rt_bench on CUDA buffers (executor, correctness, mean busbw; tables in the logs):"
  for b in rt_bench_ipc2 rt_bench_ipc4 rt_bench_staged rt_bench_nccl1; do
    [ -f "$OUT/$b.log" ] && echo "   $b:" && grep -E '^# (CUDA executor|Out of bounds|Avg bus|peer check)|absent' "$OUT/$b.log" | sed 's/^/    /'
  done
} | tee "$OUT/summary.txt"

for n in "${NAMES[@]}"; do
  case "${RESULT[$n]}" in ok*) ;; *) exit 1 ;; esac
done
exit 0
