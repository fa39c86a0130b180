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
exit $status
