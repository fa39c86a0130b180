#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (tests/fuzz/project, into build/fuzz by default) and
# runs them. Registered as the ctest test `fuzz_libfuzzer` (label slow); also the way to fuzz
# by hand.
#
#   tests/fuzz/run_fuzzers.sh                      # every target for 20 s, 2 at a time
#   tests/fuzz/run_fuzzers.sh --seconds 600 kv_index_fuzzer trace_fuzzer
#   tests/fuzz/run_fuzzers.sh --mode regress       # each target over its corpus once
#
# Options: --mode fuzz|regress (default fuzz), --seconds N per target (fuzz mode, default 20),
# --parallel N targets at a time (default 2), --build-dir DIR (default <repo>/build/fuzz),
# --jobs N for the build (default 2), then target names (default: all).
#
# Fuzz mode runs each target from its committed corpus (tests/fuzz/corpus/<target>, read
# only) plus a working corpus kept in <build-dir>/corpus/<target> (new inputs go there, so
# coverage accumulates across runs without touching the repository). Limits per target:
# -rss_limit_mb=2048 (also the largest single allocation), -timeout=10 s per input; the
# dictionary tests/fuzz/dicts/<target>.dict when there is one. A crash, sanitizer report, leak,
# out-of-memory or timeout fails the run; the input that caused it is saved under
# <build-dir>/artifacts/<target>/ and printed with the command that reproduces it.
# Keep it as a regression case: copy it to tests/fuzz/corpus/<target>/regress_<what>.
#
# Exit status: 0 when every target passed, 1 on any finding or build failure, 77 (ctest
# SKIP_RETURN_CODE) when clang++ or libFuzzer (Debian: clang, libclang-rt-14-dev) is missing.
set -euo pipefail

FUZZ_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$FUZZ_DIR/../.." && pwd)"
mode=fuzz
seconds=20
parallel=2
jobs=2
build_dir="$ROOT/build/fuzz"
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --mode) mode="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --parallel) parallel="$2"; shift 2 ;;
    --build-dir) build_dir="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    -h|--help) sed -n '2,24p' "${BASH_SOURCE[0]}"; exit 0 ;;
    -*) echo "run_fuzzers.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
case "$mode" in fuzz|regress) ;; *) echo "run_fuzzers.sh: --mode fuzz|regress" >&2; exit 2 ;; esac

log() { printf '[fuzz] %s\n' "$*" >&2; }
start=$SECONDS

# ---- toolchain: skip (77) without clang++ or libFuzzer ----------------------------------------
cxx="${PD_FUZZ_CXX:-clang++}"
cc="${PD_FUZZ_CC:-clang}"
if ! command -v "$cxx" >/dev/null || ! command -v "$cc" >/dev/null; then
  log "SKIP: $cxx / $cc not found (Debian: apt-get install clang libclang-rt-14-dev)"
  exit 77
fi
probe_dir="$(mktemp -d)"
trap 'rm -rf "$probe_dir"' EXIT
printf '#include <cstddef>\n#include <cstdint>\nextern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n' \
  >"$probe_dir/probe.cc"
if ! "$cxx" -fsanitize=fuzzer,address,undefined "$probe_dir/probe.cc" -o "$probe_dir/probe" \
     >"$probe_dir/log" 2>&1; then
  log "SKIP: $cxx cannot link -fsanitize=fuzzer,address,undefined (Debian: libclang-rt-14-dev):"
  sed 's/^/[fuzz]   /' "$probe_dir/log" | head -5 >&2
  exit 77
fi

# ---- configure and build ---------------------------------------------------------------------
mkdir -p "$build_dir"
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  log "configuring $build_dir with $cxx"
  cmake -S "$FUZZ_DIR/project" -B "$build_dir" -G Ninja \
    -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_C_COMPILER="$cc" >"$build_dir/configure.log" 2>&1 || {
    cat "$build_dir/configure.log" >&2
    log "FAILED: configuring the fuzz build"
    exit 1
  }
fi
log "building ($jobs jobs)"
build_start=$SECONDS
if ! cmake --build "$build_dir" -j "$jobs" >"$build_dir/build.log" 2>&1; then
  grep -E -B2 -A12 'error:|FAILED' "$build_dir/build.log" | head -80 >&2
  log "FAILED: the fuzz build (full log: $build_dir/build.log)"
  exit 1
fi
log "build took $((SECONDS - build_start)) s"

if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets <"$build_dir/fuzz_targets.txt"
fi

# ---- run ---------------------------------------------------------------------------------
# Runs one target; its libFuzzer output goes to <build-dir>/logs/<target>.log.
run_target() {
  local t="$1"
  local exe="$build_dir/$t" seeds="$FUZZ_DIR/corpus/$t"
  local art="$build_dir/artifacts/$t" work="$build_dir/corpus/$t" log="$build_dir/logs/$t.log"
  mkdir -p "$art" "$work" "$build_dir/logs"
  rm -f "$art"/*
  local args=(-rss_limit_mb=2048 -timeout=10 -artifact_prefix="$art/" -print_final_stats=1)
  if [ -f "$FUZZ_DIR/dicts/$t.dict" ]; then
    args+=(-dict="$FUZZ_DIR/dicts/$t.dict")
  fi
  if [ "$mode" = regress ]; then
    "$exe" "${args[@]}" -runs=0 "$seeds" >"$log" 2>&1
  else
    "$exe" "${args[@]}" -max_total_time="$seconds" "$work" "$seeds" >"$log" 2>&1
  fi
}

report_target() {
  local t="$1" status="$2"
  local art="$build_dir/artifacts/$t" log="$build_dir/logs/$t.log"
  local stats
  stats="$(grep -E '^stat::number_of_executed_units|^#[0-9]+.*DONE' "$log" | tail -1 || true)"
  if [ "$status" -eq 0 ]; then
    log "PASS $t ${stats:+($stats)}"
    return 0
  fi
  log "FAIL $t (exit $status); libFuzzer log: $log"
  grep -E -A12 '==ERROR|Check failed|runtime error|ERROR: libFuzzer' "$log" | head -40 \
    | sed 's/^/[fuzz]   /' >&2 || tail -30 "$log" | sed 's/^/[fuzz]   /' >&2
  local f
  for f in "$art"/*; do
    [ -e "$f" ] || continue
    log "reproducer: $f"
    log "  replay:   $build_dir/$t $f"
    log "  keep it:  cp $f $FUZZ_DIR/corpus/$t/regress_<what>"
  done
  return 1
}

log "mode $mode$([ "$mode" = fuzz ] && echo ", ${seconds} s per target"), ${#targets[@]} targets, $parallel at a time"
declare -A pids=()
failed=()
passed=0
wait_one() {
  local done_pid status t
  status=0
  wait -n -p done_pid "${!pids[@]}" || status=$?
  t="${pids[$done_pid]}"
  unset "pids[$done_pid]"
  if report_target "$t" "$status"; then
    passed=$((passed + 1))
  else
    failed+=("$t")
  fi
}
for t in "${targets[@]}"; do
  if [ ! -x "$build_dir/$t" ]; then
    log "FAIL $t: no such target in $build_dir/fuzz_targets.txt"
    failed+=("$t")
    continue
  fi
  while [ ${#pids[@]} -ge "$parallel" ]; do
    wait_one
  done
  run_target "$t" &
  pids[$!]="$t"
done
while [ ${#pids[@]} -gt 0 ]; do
  wait_one
done

log "total $((SECONDS - start)) s"
echo "fuzz: ${passed} passed, ${#failed[@]} failed"
if [ ${#failed[@]} -gt 0 ]; then
  log "failed: ${failed[*]}"
  exit 1
fi
