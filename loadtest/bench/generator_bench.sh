#!/usr/bin/env bash
# Load-generator ceiling (issue #7): pd-loadtest against pd-fake-generation-server (canned
# tokens, one token per message, no delay) on 127.0.0.1, both on this machine. Prints
# pd-loadtest's summary, each process's CPU seconds, and the load average before and after.
# Not run by ctest; figures and the exact command go to docs/benchmarks.md ("Load generator").
#
#   loadtest/bench/generator_bench.sh [BUILD_DIR] [-- extra pd-loadtest flags]
#   default: --concurrency=64 --num_requests=30000 --input_len=128 --output_len=50
set -euo pipefail
build=${1:-build}
[[ $# -gt 0 ]] && shift
[[ ${1:-} == "--" ]] && shift
server_bin=$build/loadtest/pd-fake-generation-server
client_bin=$build/loadtest/pd-loadtest
log=$(mktemp /tmp/pd-fake-server.XXXXXX)
"$server_bin" --address=127.0.0.1:0 >"$log" 2>&1 &
server_pid=$!
trap 'kill -INT $server_pid 2>/dev/null || true; wait $server_pid 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 100); do grep -q "listening on" "$log" && break; sleep 0.05; done
addr=$(grep -o "127.0.0.1:[0-9]*" "$log")
cpu() { awk '{printf "%.2f", ($14 + $15) / 100}' /proc/"$1"/stat; }
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
server_cpu0=$(cpu $server_pid)
/usr/bin/time -f "pd-loadtest cpu: %U s user + %S s sys, wall %e s" \
  "$client_bin" --target="$addr" --progress=off --concurrency=64 --num_requests=30000 \
  --input_len=128 --output_len=50 "$@"
server_cpu1=$(cpu $server_pid)
echo "fake server cpu: $(echo "$server_cpu1 - $server_cpu0" | bc) s"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
