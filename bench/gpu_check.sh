#!/usr/bin/env bash
# The one-GPU check: what only a GPU can show about the device path, in the window a lent
# machine gives (one H200, 16 cores; 15 minutes of device time in all, at most 10 per command).
# Every multi-process stage puts several ranks on the one GPU (time-sliced); NCCL refuses two
# ranks on one device, which is itself checked. Stages run in order of value, each within its own
# time limit; the limits add up to no more than the budget (CHECK_BUDGET, default 450 s), so the
# whole check ends in under 8 minutes whatever hangs, and a stage that fails or runs out of time
# is reported while the next one still runs. Where the machine has several GPUs, each rank takes
# GPU rank % GPUs, so the IPC stages run across GPUs, and cross_gpu checks that no rank holds a
# context on a GPU it does not use.
#
#   OUT=/path/to/logs bash bench/gpu_check.sh            the check (an sm_90 build first)
#   bash bench/gpu_check.sh --plan                       the stages and their limits; fails if
#                                                        they do not fit in the budget
#   bash bench/gpu_check.sh --standin [--only a,b]       the same stages over the CUDA stand-in
#                                                        (no GPU; the installed ringtree and its
#                                                        test module); stages only a GPU can run
#                                                        are skipped and say so
#
# Every test runs with RINGTREE_TIMEOUT short (a hang costs seconds, not the 300 s default) and a
# per-test time limit; failing ranks leave flight-recorder dumps in $OUT/dumps; the log of each
# stage is $OUT/<stage>.log and the summary (every stage, every test's verdict) $OUT/summary.txt.
# Settings: PYTHON (default /opt/torch/.venv/bin/python3, else python3), BUILD_DIR (default
# build/gpu-check), KEEP_BUILD=1 (reuse BUILD_DIR, e.g. one built elsewhere for sm_90),
# CHECK_BUDGET, CMAKE_CUDA_ARCHITECTURES (default 90), ONLY (as --only).
set -u
START=$(date +%s)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2

MODE=gpu
ONLY=${ONLY:-}
while [ $# -gt 0 ]; do
  case "$1" in
    --plan) MODE=plan ;;
    --standin) MODE=standin ;;
    --only) ONLY=$2; shift ;;
    *) echo "usage: gpu_check.sh [--plan | --standin] [--only stage,stage]" >&2; exit 2 ;;
  esac
  shift
done

BUDGET=${CHECK_BUDGET:-450}
# name:limit, in order of value. The limits must add up to no more than BUDGET.
STAGES=(env:15 build:110 ipc_p2:40 ipc_p4:50 semantics:30 staged:30 torch:35 nccl:25 sanitize:45 bench_ipc:20
        thread_ranks:30 cross_gpu:15)

if [ "$MODE" = plan ]; then
  total=0
  for s in "${STAGES[@]}"; do
    printf '%-13s %4d s\n' "${s%%:*}" "${s##*:}"
    total=$((total + ${s##*:}))
  done
  printf '%-13s %4d s of a %d s budget (8 minutes: 480 s)\n' total "$total" "$BUDGET"
  [ "$total" -le "$BUDGET" ] && [ "$BUDGET" -le 480 ]
  exit $?
fi

OUT=${OUT:-$ROOT/gpu-logs}
mkdir -p "$OUT/dumps"
OUT=$(cd "$OUT" && pwd)
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
for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
  [ -x "$d/nvcc" ] && ! command -v nvcc >/dev/null 2>&1 && export PATH="$d:$PATH"
  [ -x "$d/compute-sanitizer" ] && ! command -v compute-sanitizer >/dev/null 2>&1 && export PATH="$PATH:$d"
done
export RINGTREE_TIMEOUT=${RINGTREE_TIMEOUT:-15}
export RINGTREE_DUMP_DIR="$OUT/dumps"
export PYTHONDONTWRITEBYTECODE=1
PER_TEST=60
PYTEST=("$PY" -m pytest -v -rA -p no:cacheprovider --timeout="$PER_TEST")
SKIP=77  # a stage's exit status for "cannot run here", with its reason in the log

env_report() {
  echo "mode: $MODE; budget ${BUDGET}s; RINGTREE_TIMEOUT=$RINGTREE_TIMEOUT"
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_mode,mig.mode.current \
      --format=csv 2>&1
    echo "MPS: $(pgrep -f nvidia-cuda-mps-control >/dev/null && echo "control daemon running" || echo "no control daemon")"\
         "(CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-unset})"
  else
    echo "nvidia-smi: absent"
  fi
  echo "python: $PY ($("$PY" --version 2>&1))"
  command -v nvcc >/dev/null && nvcc --version | tail -n 1 || echo "nvcc: absent"
  command -v compute-sanitizer >/dev/null && compute-sanitizer --version | tail -n 1 || echo "compute-sanitizer: absent"
  command -v cmake >/dev/null && cmake --version | head -n 1
  "$PY" - <<'EOF'
import importlib
for name in ("torch", "cupy", "numpy", "pybind11", "pytest", "ringtree", "_ringtree_testing"):
    try:
        m = importlib.import_module(name)
        extra = ""
        if name == "torch":
            extra = f" cuda={m.version.cuda} available={m.cuda.is_available()} devices={m.cuda.device_count()}"
        if name == "ringtree":
            extra = f" {m.__file__} cuda_built={m._core.cuda_built()} cuda_available={m.cuda_available()}"
        print(f"{name} {getattr(m, '__version__', '')}{extra}")
    except Exception as e:  # noqa: BLE001
        print(f"{name}: not importable ({e})")
EOF
}

gpu_count() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -c '^GPU' || echo 0
}

# ---- the stages: each runs its GPU command or, with --standin, its stand-in counterpart -------

stage_env() { env_report; }

stage_build() {
  if [ "$MODE" = standin ]; then
    echo "stand-in mode builds nothing: the installed ringtree and its test module"
    "$PY" -c 'import ringtree, _ringtree_testing; print(ringtree.__file__); print(_ringtree_testing.__file__)'
    return
  fi
  if [ "${KEEP_BUILD:-0}" != 1 ] || [ ! -f "$BUILD/CMakeCache.txt" ]; then
    rm -rf "$BUILD"
    local gen=()
    command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
    cmake -S "$ROOT" -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DRINGTREE_CUDA=ON -DRINGTREE_TESTING=OFF \
      -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DPython_EXECUTABLE="$PY" -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" \
      || return 1
  fi
  cmake --build "$BUILD" -j "$JOBS" || return 1
  # The package as the tests import it: python/ringtree and the fresh _core, in $BUILD/site.
  rm -rf "$BUILD/site" && mkdir -p "$BUILD/site" && cp -r "$ROOT/python/ringtree" "$BUILD/site/" &&
    rm -f "$BUILD"/site/ringtree/_core*.so && cp "$BUILD"/_core*.so "$BUILD/site/ringtree/" || return 1
  "$PY" -c 'import ringtree as rt; print(rt.__file__, rt._core.cuda_built(), rt.cuda_available(), rt._core.cuda_unavailable_reason())'
}

device_tests() {  # pytest -k EXPR over the multi-process device tests
  "${PYTEST[@]}" tests/gpu/test_device_comm.py -k "$1"
}

standin_tests() {  # pytest FILE [-k EXPR] over the stand-in's tests
  if [ -n "${2:-}" ]; then "${PYTEST[@]}" "$1" -k "$2"; else "${PYTEST[@]}" "$1"; fi
}

stage_ipc_p2() {
  [ "$MODE" = standin ] && { standin_tests tests/gpu/test_ipc_standin.py "matches_numpy and P2"; return; }
  device_tests "match_numpy and 2-ipc"
}

stage_ipc_p4() {
  [ "$MODE" = standin ] && { standin_tests tests/gpu/test_ipc_standin.py "matches_numpy and P4"; return; }
  device_tests "match_numpy and 4-ipc"
}

stage_semantics() {
  [ "$MODE" = standin ] && { standin_tests tests/gpu/test_ipc_standin.py "stalled or returns_before or ordered"; return; }
  device_tests "stalled_peer or returns_before"
}

stage_staged() {
  [ "$MODE" = standin ] && { standin_tests tests/gpu/test_ipc_standin.py "staged"; return; }
  device_tests "match_numpy and 2-staged"
}

stage_torch() {
  [ "$MODE" = standin ] && { echo "skipped: needs torch with CUDA"; return $SKIP; }
  device_tests "torch_backend or data_parallel or async_and_cupy"
}

stage_nccl() {
  [ "$MODE" = standin ] && { standin_tests tests/gpu/test_standin_lifecycle.py "nccl"; return; }
  # One rank: every collective against numpy; two ranks on one GPU: NCCL refuses, on every rank.
  device_tests "nccl_algo"
}

stage_sanitize() {
  if [ "$MODE" = standin ] || ! command -v compute-sanitizer >/dev/null 2>&1; then
    echo "skipped: needs compute-sanitizer and a GPU"
    return $SKIP
  fi
  # The walk kernel's shared state and block barriers (racecheck: shared-memory races; synccheck:
  # barriers not every thread reaches), one channel and two, across two ranks on the GPU.
  local rc=0 tool channels
  for run in racecheck:1 racecheck:2 synccheck:1; do
    tool=${run%%:*}
    channels=${run##*:}
    echo "== compute-sanitizer --tool $tool, RINGTREE_CUDA_IPC_CHANNELS=$channels"
    RINGTREE_CUDA_IPC_CHANNELS=$channels compute-sanitizer --tool "$tool" --target-processes all --error-exitcode 3 \
      "$PY" -m ringtree.launch -n 2 --timeout 12 bench/gpu_check_ranks.py allreduce 4096 2 || rc=1
  done
  return $rc
}

stage_bench_ipc() {
  [ "$MODE" = standin ] && { echo "skipped: the bench runs on torch CUDA tensors"; return $SKIP; }
  "$PY" -m ringtree.launch -n 2 --timeout 18 bench/rt_bench.py --device cuda --no-progress --collective all_reduce \
    -b 8 -e 16M -f 8 -n 5 -w 2 --vs memcpy
}

stage_thread_ranks() {
  [ "$MODE" = standin ] && { standin_tests tests/gpu/test_gpu.py "standin"; return; }
  "${PYTEST[@]}" tests/gpu/test_gpu.py
}

stage_cross_gpu() {
  [ "$MODE" = standin ] && { standin_tests tests/gpu/test_standin_devices.py ""; return; }
  local gpus
  gpus=$(gpu_count)
  if [ "$gpus" -lt 2 ]; then
    echo "skipped: $gpus GPU (the IPC stages ran every rank on it)"
    return $SKIP
  fi
  "$PY" -m ringtree.launch -n 2 --timeout 12 bench/gpu_check_ranks.py contexts
}

# timeout(1) runs programs, not shell functions: export them, and what they read, for bash -c.
export ROOT BUILD PY ARCH MODE BUDGET JOBS OUT SKIP
export -f env_report gpu_count device_tests standin_tests
for s in "${STAGES[@]}"; do export -f "stage_${s%%:*}"; done
export PYTEST_STR="${PYTEST[*]}"
# Arrays do not cross into bash -c: rebuild PYTEST there.
PYTEST_INIT='PYTEST=($PYTEST_STR)'

if [ "$MODE" = gpu ]; then
  [ "${KEEP_BUILD:-0}" = 1 ] || rm -rf "$BUILD"
  export PYTHONPATH="$BUILD/site${PYTHONPATH:+:$PYTHONPATH}"
fi

declare -a NAMES=()
declare -A RESULT=()

# run_stage NAME LIMIT: the stage's function, its output in $OUT/NAME.log, within its own limit
# and what is left of the budget; records and prints the outcome and the log's tail.
run_stage() {
  local name=$1 limit=$2 log="$OUT/$1.log" left t0 rc dur
  left=$((BUDGET - ($(date +%s) - START)))
  NAMES+=("$name")
  if [ "$left" -lt 5 ]; then
    RESULT[$name]="SKIPPED (the ${BUDGET} s budget is used up)"
    echo "==== $name: skipped, the budget is used up" | tee "$log"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "==== $name (limit ${limit} s)"
  t0=$(date +%s)
  timeout --kill-after=5 "$limit" bash -c "$PYTEST_INIT; stage_$name" >"$log" 2>&1
  rc=$?
  dur=$(($(date +%s) - t0))
  case $rc in
    0) RESULT[$name]="ok (${dur} s)" ;;
    "$SKIP") RESULT[$name]="skipped: $(grep -m1 '^skipped:' "$log" | cut -d: -f2- | sed 's/^ //')" ;;
    124|137) RESULT[$name]="TIMED OUT after ${dur} s (limit ${limit} s)" ;;
    *) RESULT[$name]="FAILED rc=$rc (${dur} s)" ;;
  esac
  echo "---- $name: ${RESULT[$name]}; tail of $log:"
  tail -n 25 "$log"
}

for s in "${STAGES[@]}"; do
  name=${s%%:*}
  if [ -n "$ONLY" ] && [[ ",$ONLY," != *",$name,"* ]]; then continue; fi
  run_stage "$name" "${s##*:}"
done

{
  echo "==================== gpu_check summary ($(date -u +%FT%TZ), $(($(date +%s) - START)) s of ${BUDGET} s) ===================="
  echo "mode: $MODE; repo: $ROOT ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null) + working tree); logs: $OUT"
  grep -m1 -E 'NVIDIA|nvidia-smi: absent' "$OUT/env.log" 2>/dev/null | sed 's/^/device: /'
  for n in "${NAMES[@]}"; do printf '  %-13s %s\n' "$n" "${RESULT[$n]}"; done
  echo "-- every test's verdict:"
  for n in "${NAMES[@]}"; do
    grep -hE '^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) ' "$OUT/$n.log" 2>/dev/null | sed "s/^/  [$n] /"
  done
  echo "-- other checks:"
  grep -hE '^rank [0-9]+.*(wrong|contexts|executor)|ERROR SUMMARY|^# (CUDA executor|Out of bounds|Avg bus)' \
    "$OUT"/sanitize.log "$OUT"/cross_gpu.log "$OUT"/bench_ipc.log 2>/dev/null | sed 's/^/  /'
  dumps=$(find "$OUT/dumps" -type f 2>/dev/null | wc -l)
  echo "-- flight-recorder dumps: $dumps in $OUT/dumps"
} | tee "$OUT/summary.txt"

for n in "${NAMES[@]}"; do
  case "${RESULT[$n]}" in ok*|skipped:*) ;; *) exit 1 ;; esac
done
exit 0
