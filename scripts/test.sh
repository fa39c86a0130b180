#!/usr/bin/env bash
# Set up (install missing packages, configure, build) and run every test with ctest.
# Extra arguments go to ctest, e.g. scripts/test.sh -L unit   or   scripts/test.sh -R BlockHash
# GPU tests are registered with the `gpu` label and skip themselves without a device.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"

total_start=$SECONDS
pd_setup
pd_log "running tests"
test_start=$SECONDS
status=0
ctest --test-dir "$PD_BUILD_DIR" -j "$(nproc)" --output-on-failure --timeout 600 "$@" || status=$?
pd_log "tests took $((SECONDS - test_start)) s; set-up + build + tests took $((SECONDS - total_start)) s"
# The sanitizer jobs (issue #10): in CI, or when asked; not when running a subset (ctest args).
if [ $# -eq 0 ] && { [ "${CI:-}" = "true" ] || [ "${PD_SANITIZERS:-0}" = 1 ]; }; then
  san_start=$SECONDS
  bash "$(dirname "${BASH_SOURCE[0]}")/sanitize.sh" || status=1
  pd_log "sanitizer jobs took $((SECONDS - san_start)) s; total $((SECONDS - total_start)) s"
fi
exit $status
