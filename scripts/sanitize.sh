#!/usr/bin/env bash
# Builds and runs a chosen set of tests once more under sanitizers (issue #10 item 2):
#   address  -fsanitize=address,undefined: the unit and integration tests of the layers that own
#            memory and parsing: common, the KV cache and scheduler, tierd's storage and Redis
#            index, the transport and the engine's KV hand-off (its staging area), the router's
#            index and scorer, the KV events, the OpenAI request parser (its unit catalogue and
#            its fuzz corpus, nesting 100,000 deep)
#   thread   -fsanitize=thread: the concurrency-heavy ones (router index, scheduler + engine
#            loop, transport, Redis client, thread pool, tierd's DRAM pool). NOT run by default:
#            Debian 12's Abseil is a shared library built without TSan, so absl::Mutex (which
#            does not use pthread mutexes) gives TSan no happens-before edges and every
#            mutex-protected access is reported as a race. Useful only with an instrumented
#            Abseil; see docs/development.md "Sanitizers".
# Each sanitizer gets its own build directory (CUDA off: nvcc does not take -fsanitize); only
# the listed test targets are built, which keeps it within the CI budget. Called by
# scripts/test.sh when CI=true or PD_SANITIZERS=1; run by hand as scripts/sanitize.sh
# [address|thread] (default address). Exit status: non-zero if any build or test failed.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"

PD_ASAN_TESTS=(
  common_base_test common_hash_test common_metrics_test common_threads_test common_time_test
  common_redis_client_test common_redis_client_integration_test common_redis_prefix_index_test
  engine_kvcache_test engine_memory_test engine_scheduler_test engine_disagg_test
  engine_grammar_test engine_grammar_schema_set_test
  services_tierd_test services_tierd_integration_test
  services_tierd_redis_index_test services_tierd_redis_index_integration_test
  services_router_index_test services_router_scorer_test
  services_kv_events_test
  services_router_openai_protocol_test fuzz_openai_request_fuzzer_corpus_test
  transport_test transport_conformance_test transport_two_process_test transport_ucx_test
)
PD_TSAN_TESTS=(
  common_threads_test common_redis_client_integration_test
  engine_scheduler_test engine_runtime_test
  services_router_index_test services_tierd_test
  transport_test
)

pd_sanitize_run() {
  local name=$1 flags=$2
  shift 2
  local targets=("$@")
  local dir="${PD_ROOT}/build-${name}"
  local start=$SECONDS
  pd_log "sanitizer ${name} (${flags}): configuring ${dir}"
  if ! cmake -S "$PD_ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DPD_SANITIZE="$flags" -DPD_ENABLE_CUDA=OFF -DPD_ENABLE_NCCL=OFF -DPD_WERROR=ON >/dev/null; then
    pd_log "sanitizer ${name}: configure failed"
    return 1
  fi
  pd_log "sanitizer ${name}: building ${#targets[@]} test targets"
  # (Explicit checks: this function runs under `||`, where set -e does not apply.)
  if ! cmake --build "$dir" -j "$(nproc)" --target "${targets[@]}"; then
    pd_log "sanitizer ${name}: build failed"
    return 1
  fi
  pd_log "sanitizer ${name}: running"
  # Each test binary directly, from the source root as ctest would (ctest would also list the
  # tests of every target not built here).
  local status=0 t bin
  for t in "${targets[@]}"; do
    bin="$(find "$dir" -name "$t" -type f -perm -u+x | head -n 1)"
    if [ -z "$bin" ]; then
      pd_log "sanitizer ${name}: $t was not built"
      status=1
      continue
    fi
    if ! (cd "$PD_ROOT" &&
      ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1" \
      UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
      TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1" \
      timeout 900 "$bin" --gtest_brief=1 >"$dir/$t.log" 2>&1); then
      pd_log "sanitizer ${name}: $t FAILED; last lines of $dir/$t.log:"
      tail -n 60 "$dir/$t.log" >&2
      status=1
    else
      pd_log "sanitizer ${name}: $t: $(grep -a -o 'PASSED  \] [0-9]* tests\?' "$dir/$t.log" | tail -n 1 | sed 's/PASSED  ] //') passed"
    fi
  done
  pd_log "sanitizer ${name}: $((SECONDS - start)) s, status ${status}"
  return $status
}

which=${1:-address}
status=0
case "$which" in
  address) pd_sanitize_run asan address,undefined "${PD_ASAN_TESTS[@]}" || status=1 ;;
  thread) pd_sanitize_run tsan thread "${PD_TSAN_TESTS[@]}" || status=1 ;;
  *) pd_log "usage: scripts/sanitize.sh [address|thread]"; exit 2 ;;
esac
exit $status
