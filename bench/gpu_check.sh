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
# per-test time limit that a test's own @pytest.mark.timeout cannot raise (bench/gpu_check_pytest.py);
# each test's start and verdict are written as they happen, so a stage cut off by its limit still
# reports every test it started (those unfinished as TIMEOUT). Failing ranks leave flight-recorder
# dumps in $OUT/dumps; the log of each stage is $OUT/<stage>.log, its verdicts
# $OUT/<stage>.verdicts, and the summary (every stage, every test's verdict) $OUT/summary.txt.
# The env stage checks the check's own needs (pytest, pytest-timeout: installed with pip when
# missing and possible) and fails, saying what is missing, when it cannot meet them.
# Ranks sharing the one GPU: the multi-rank stages run under MPS where the machine allows it (its
# control daemon started here, pipe and logs under $OUT/mps, stopped at exit), so the ranks'
# kernels run side by side instead of in time slices; where it does not, they run time-sliced and
# the env log says why.
# Settings: PYTHON (default /opt/torch/.venv/bin/python3, else python3), BUILD_DIR (default
# build/gpu-check), KEEP_BUILD=1 (reuse BUILD_DIR, e.g. one built elsewhere for sm_90),
# CHECK_BUDGET, CMAKE_CUDA_ARCHITECTURES (default 90), ONLY (as --only), USE_MPS (auto|0, default
# auto), PER_TEST (seconds a test may take, default
# 60 on a GPU, the stage's limit over the stand-in; never more than the stage's limit).
# The script's own tests add a stage: GPU_CHECK_SELFTEST=FILE:LIMIT runs pytest FILE last.
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

# name:limit:stand-in limit, in order of value. The limits must add up to no more than the budget:
# BUDGET (CHECK_BUDGET, default 450 s) on a GPU; in stand-in mode, where the device code runs on the
# CPU (a loaded 2-core machine is slower than the GPU machine's 16 cores), its own limits and
# budget (CHECK_BUDGET, default 480 s), and each stand-in stage runs a slice sized to fit them.
STAGES=(env:15:15 build:110:10 ipc_p2:40:50 ipc_p4:50:100 semantics:30:75 staged:30:60 bench_ipc:20:5 torch:35:5
        nccl:25:45 sanitize:45:5 thread_ranks:30:30 cross_gpu:15:50)
if [ "$MODE" = standin ]; then BUDGET=${CHECK_BUDGET:-480}; else BUDGET=${CHECK_BUDGET:-450}; fi
# The stages that put several ranks on the one GPU, run under MPS where it can be started (the
# bench too: ranks time-sliced on one GPU wait a slice at each step, and it would time the slices).
MPS_STAGES=",ipc_p2,ipc_p4,semantics,staged,bench_ipc,"

if [ "$MODE" = plan ]; then
  BUDGET=${CHECK_BUDGET:-450}
  total=0 stotal=0
  for s in "${STAGES[@]}"; do
    IFS=: read -r name limit slimit <<<"$s"
    printf '%-13s %4d s   (stand-in %3d s)\n' "$name" "$limit" "$slimit"
    total=$((total + limit))
    stotal=$((stotal + slimit))
  done
  printf '%-13s %4d s of a %d s budget (8 minutes: 480 s); stand-in %d s of 480 s\n' total "$total" "$BUDGET" "$stotal"
  [ "$total" -le "$BUDGET" ] && [ "$BUDGET" -le 480 ] && [ "$stotal" -le 480 ]
  exit $?
fi
# The stages' limits for this mode: name:limit.
for i in "${!STAGES[@]}"; do
  IFS=: read -r name limit slimit <<<"${STAGES[$i]}"
  [ "$MODE" = standin ] && limit=$slimit
  STAGES[$i]="$name:$limit"
done

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
# A test's limit: PER_TEST seconds on a GPU; over the stand-in, whatever its stage leaves.
if [ "$MODE" = standin ]; then PER_TEST=${PER_TEST:-480}; else PER_TEST=${PER_TEST:-60}; fi
# The plugin (bench/gpu_check_pytest.py) caps every test's limit and writes the verdicts.
export PYTHONPATH="$ROOT/bench${PYTHONPATH:+:$PYTHONPATH}"
PYTEST=("$PY" -m pytest -v -rA -p no:cacheprovider -p gpu_check_pytest)
SKIP=77  # a stage's exit status for "cannot run here", with its reason in the log
SELFTEST=${GPU_CHECK_SELFTEST:-}
[ -n "$SELFTEST" ] && STAGES+=("selftest:${SELFTEST##*:}")

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

# The check's own needs: pytest and pytest-timeout (installed with pip when missing, where the
# machine can reach an index), and in stand-in mode the test module. Fails saying what is missing.
check_deps() {
  local missing
  missing=$("$PY" -c 'import importlib.util as u; print(" ".join(m for m in ("pytest", "pytest_timeout") if not u.find_spec(m)))')
  if [ -n "$missing" ]; then
    echo "installing the check's test dependencies ($missing) with pip"
    # Within the stage's limit: one try, short timeouts (a GPU machine may reach no index at all).
    timeout 9 "$PY" -m pip install --quiet --retries 0 --timeout 4 pytest pytest-timeout 2>&1 | tail -n 3
    missing=$("$PY" -c 'import importlib.util as u; print(" ".join(m for m in ("pytest", "pytest_timeout") if not u.find_spec(m)))')
  fi
  if [ -n "$missing" ]; then
    echo "MISSING: $missing for $PY, and pip could not install them: run '$PY -m pip install pytest pytest-timeout'" \
         "(or set PYTHON to an interpreter that has them); every pytest stage needs them"
    return 1
  fi
  if [ "$MODE" = standin ] && ! "$PY" -c 'import _ringtree_testing' 2>/dev/null; then
    echo "MISSING: the test module _ringtree_testing (build ringtree with RINGTREE_TESTING=ON, the default)"
    return 1
  fi
  echo "test dependencies: pytest $("$PY" -c 'import pytest; print(pytest.__version__)'), pytest-timeout present"
}

stage_env() {
  env_report
  check_deps
}

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
  # One of the stand-in's two 4-rank worlds (3 channels, shuffled): both outgrow a loaded 2-core machine.
  [ "$MODE" = standin ] && { standin_tests tests/gpu/test_ipc_standin.py "matches_numpy and P4-C3"; return; }
  device_tests "match_numpy and 4-ipc"
}

stage_semantics() {
  [ "$MODE" = standin ] && { standin_tests tests/gpu/test_ipc_standin.py "stalled or returns_before or ordered"; return; }
  device_tests "stalled_peer or returns_before"
}

stage_staged() {
  [ "$MODE" = standin ] && { standin_tests tests/gpu/test_ipc_standin.py "staged and not capturing"; return; }
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
  # The walk kernel's shared state and block barriers (synccheck: barriers not every thread
  # reaches; racecheck: shared-memory races), one channel and two, across two ranks on the GPU,
  # cheapest first, each within its share of the stage. A refusal by the tool ("Device not
  # supported" on some virtualised runtimes, MPS) is a skip with its words, not a failure of the
  # code; so is a run the tool did not finish in its time (spinning ranks under racecheck are slow).
  local failed=0 refused="" slow="" tool channels log rc
  for run in synccheck:1 racecheck:1 racecheck:2; do
    tool=${run%%:*}
    channels=${run##*:}
    log=$(mktemp)
    echo "== compute-sanitizer --tool $tool, RINGTREE_CUDA_IPC_CHANNELS=$channels"
    RINGTREE_CUDA_IPC_CHANNELS=$channels timeout --kill-after=3 12 compute-sanitizer --tool "$tool" \
      --target-processes all --error-exitcode 3 \
      "$PY" -m ringtree.launch -n 2 --timeout 10 bench/gpu_check_ranks.py allreduce 4096 1 >"$log" 2>&1
    rc=$?
    cat "$log"
    if grep -qiE 'device not supported|not supported on|unsupported (device|gpu|platform)' "$log" &&
       ! grep -qE 'ERROR SUMMARY: [1-9]' "$log"; then
      refused=$(grep -m1 -iE 'not supported|unsupported' "$log" | sed 's/^=* *//')
      echo "-- $tool: refused by the tool: $refused"
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
      if grep -qE 'ERROR SUMMARY: [1-9]|^========= (Race|Barrier|Invalid)' "$log"; then failed=1; else slow="$slow $tool:$channels"; fi
      echo "-- $tool: did not finish in 12 s"
    elif [ $rc -ne 0 ]; then
      failed=1
      echo "-- $tool: FAILED (rc $rc)"
    else
      echo "-- $tool: clean"
    fi
    rm -f "$log"
  done
  [ $failed -ne 0 ] && return 1
  if [ -n "$refused" ]; then echo "skipped: compute-sanitizer refused: $refused"; return $SKIP; fi
  if [ -n "$slow" ]; then echo "skipped: inconclusive, compute-sanitizer did not finish:$slow (none reported an error)"; return $SKIP; fi
  return 0
}

stage_bench_ipc() {
  [ "$MODE" = standin ] && { echo "skipped: the bench runs on torch CUDA tensors"; return $SKIP; }
  "$PY" -m ringtree.launch -n 2 --timeout 18 bench/rt_bench.py --device cuda --no-progress --collective all_reduce \
    -b 8 -e 16M -f 8 -n 5 -w 2 --vs memcpy
}

stage_thread_ranks() {
  [ "$MODE" = standin ] && { standin_tests tests/gpu/test_gpu.py "standin"; return; }
  # The GPU build has no test module (RINGTREE_TESTING=OFF): its stand-in tests are --standin's.
  echo "the build has no _ringtree_testing: its stand-in tests run in --standin mode, not here"
  "${PYTEST[@]}" tests/gpu/test_gpu.py -k "not standin"
}

stage_selftest() { "${PYTEST[@]}" "${SELFTEST%:*}"; }

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
export ROOT BUILD PY ARCH MODE BUDGET JOBS OUT SKIP SELFTEST
export -f env_report check_deps gpu_count device_tests standin_tests
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

# MPS for the stages that put several ranks on the GPU: a control daemon of this script's own
# (pipe and logs under $OUT/mps), where the tools are there, the GPU's compute mode allows it and
# no daemon already runs; stopped after those stages and at exit whatever happens.
MPS_STATE="not used"
mps_start() {
  [ "$MODE" = gpu ] || { MPS_STATE="not used (stand-in)"; return; }
  [ "${USE_MPS:-auto}" = 0 ] && { MPS_STATE="not used (USE_MPS=0)"; return; }
  command -v nvidia-cuda-mps-control >/dev/null 2>&1 || { MPS_STATE="not used: no nvidia-cuda-mps-control"; return; }
  if pgrep -x nvidia-cuda-mps >/dev/null 2>&1 || pgrep -f nvidia-cuda-mps-control >/dev/null 2>&1; then
    MPS_STATE="not started: a control daemon already runs (the ranks use it if their pipe directory points at it)"
    return
  fi
  local mode
  mode=$(nvidia-smi --query-gpu=compute_mode --format=csv,noheader 2>/dev/null | head -n 1)
  case "$mode" in
    *Prohibited*) MPS_STATE="not used: compute mode $mode"; return ;;
  esac
  mkdir -p "$OUT/mps/pipe" "$OUT/mps/log"
  export CUDA_MPS_PIPE_DIRECTORY="$OUT/mps/pipe" CUDA_MPS_LOG_DIRECTORY="$OUT/mps/log"
  if nvidia-cuda-mps-control -d >/dev/null 2>&1; then
    MPS_STATE="started (pipe $CUDA_MPS_PIPE_DIRECTORY)"
    MPS_RUNNING=1
  else
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    MPS_STATE="could not start (see $OUT/mps/log): the ranks share the GPU in time slices"
  fi
}
mps_stop() {
  [ "${MPS_RUNNING:-0}" = 1 ] || return 0
  echo quit | timeout 10 nvidia-cuda-mps-control >/dev/null 2>&1
  MPS_RUNNING=0
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}
trap mps_stop EXIT

# verdicts NAME: every test the stage started, with its verdict; a test that started and has none
# was still running when the stage's limit ended it.
verdicts() {
  local file="$OUT/$1.verdicts"
  [ -f "$file" ] || return 0
  awk -F '\t' '
    { id = $2; if (!(id in seen)) { order[++n] = id; seen[id] = 1 } }
    $1 != "START" { line[id] = $1 " " id ($3 != "" ? " - " $3 : "") }
    END { for (i = 1; i <= n; i++) print (order[i] in line) ? line[order[i]] : "TIMEOUT " order[i] " - still running when the stage was stopped" }
  ' "$file"
}

# run_stage NAME LIMIT: the stage's function, its output in $OUT/NAME.log, within its own limit
# and what is left of the budget; records and prints the outcome, the tests' verdicts and the
# log's tail.
run_stage() {
  local name=$1 limit=$2 log="$OUT/$1.log" left t0 rc dur per_test timed_out
  left=$((BUDGET - ($(date +%s) - START)))
  NAMES+=("$name")
  rm -f "$OUT/$name.verdicts"
  if [ "$left" -lt 5 ]; then
    RESULT[$name]="SKIPPED (the ${BUDGET} s budget is used up)"
    echo "==== $name: skipped, the budget is used up" | tee "$log"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  # A test may take its stage's limit less a margin for pytest itself, and never more than PER_TEST.
  per_test=$((limit - 4))
  [ "$per_test" -gt "$PER_TEST" ] && per_test=$PER_TEST
  [ "$per_test" -lt 2 ] && per_test=2
  echo "==== $name (limit ${limit} s, ${per_test} s a test)"
  t0=$(date +%s)
  GPU_CHECK_VERDICTS="$OUT/$name.verdicts" GPU_CHECK_PER_TEST=$per_test \
    timeout --kill-after=5 "$limit" bash -c "$PYTEST_INIT; stage_$name" >"$log" 2>&1
  rc=$?
  dur=$(($(date +%s) - t0))
  timed_out=$(verdicts "$name" | grep -c '^TIMEOUT ')
  case $rc in
    0) RESULT[$name]="ok (${dur} s)" ;;
    "$SKIP") RESULT[$name]="skipped: $(grep -m1 '^skipped:' "$log" | cut -d: -f2- | sed 's/^ //')" ;;
    124|137) RESULT[$name]="TIMED OUT after ${dur} s (limit ${limit} s; $timed_out test(s) unfinished)" ;;
    *) RESULT[$name]="FAILED rc=$rc (${dur} s)$(grep -m1 '^MISSING:' "$log" | sed 's/^/: /')" ;;
  esac
  echo "---- $name: ${RESULT[$name]}; verdicts:"
  verdicts "$name" | sed 's/^/  /'
  echo "---- tail of $log:"
  tail -n 15 "$log"
}

for s in "${STAGES[@]}"; do
  name=${s%%:*}
  if [ -n "$ONLY" ] && [[ ",$ONLY," != *",$name,"* ]] && [ "$name" != selftest ]; then continue; fi
  if [[ "$MPS_STAGES" == *",$name,"* ]]; then
    [ "$MPS_STATE" = "not used" ] && { mps_start; echo "MPS: $MPS_STATE"; }
  else
    mps_stop
  fi
  run_stage "$name" "${s##*:}"
done
mps_stop

{
  echo "==================== gpu_check summary ($(date -u +%FT%TZ), $(($(date +%s) - START)) s of ${BUDGET} s) ===================="
  echo "mode: $MODE; repo: $ROOT ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null) + working tree); logs: $OUT"
  grep -m1 -E 'NVIDIA|nvidia-smi: absent' "$OUT/env.log" 2>/dev/null | sed 's/^/device: /'
  echo "ranks sharing the GPU: MPS $MPS_STATE"
  uptime | sed 's/^.*load average/load average/'
  for n in "${NAMES[@]}"; do printf '  %-13s %s\n' "$n" "${RESULT[$n]}"; done
  echo "-- every test's verdict:"
  for n in "${NAMES[@]}"; do verdicts "$n" | sed "s/^/  [$n] /"; done
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
