#!/usr/bin/env bash
# SnapKV on the prefill worker (issue #35, docs/benchmarks.md "SnapKV on the prefill worker"):
# the same synthetic prompts through a local 1P+1D cluster (pd-local, no tiers), first with no
# KV policy (the whole prompt's blocks cross), then with the decode worker under
# --kv_policy=snapkv (the prefill worker compresses the prompt and sends only the kept tokens'
# blocks). The decode worker's pd_worker_kv_transfer_bytes_total{direction="in"}, the prefill
# worker's pd_worker_kv_transfer_seconds and pd-loadtest's time to first token say what the
# compression saves. Runs alternate (full, snapkv, full, snapkv) so noise shows.
#
# usage: scripts/bench_snapkv_handoff.sh MODEL_DIR [INPUT_LEN] [REQUESTS] [BUDGET] [RECENT]
#   MODEL_DIR  a Hugging Face model (e.g. pd-make-model --preset small --out /tmp/small)
#   INPUT_LEN  prompt tokens (default 1024); REQUESTS per run (default 12)
#   BUDGET     tokens kept (default INPUT_LEN / 4); RECENT the observation window (default 32)
# Environment: BUILD_DIR (default build), RUNS (default 2 of each). Prints one line per run.
set -euo pipefail

[ $# -ge 1 ] || { sed -n 2,15p "$0"; exit 2; }
model=$1
input_len=${2:-1024}
requests=${3:-12}
budget=${4:-$((input_len / 4))}
recent=${5:-32}
runs=${RUNS:-2}
build=${BUILD_DIR:-build}
here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib/bench_cluster.sh
. "$here/scripts/lib/bench_cluster.sh"

printf '%-8s %9s %12s %14s %12s %12s\n' policy prefills "KiB/request" "transfer ms" \
  "TTFT ms" "remote"
for i in $(seq 1 "$runs"); do
  for policy in full snapkv; do
    run="$work/$policy-$i"
    args=(--worker_arg=--kv_blocks=512)
    if [ "$policy" = snapkv ]; then
      args+=(--decode_arg=--kv_policy=snapkv --decode_arg=--kv_budget_tokens="$budget"
        --decode_arg=--kv_recent_tokens="$recent")
    fi
    start_cluster "$run" "$model" "${args[@]}"
    "$build/loadtest/pd-loadtest" --target="$(cat "$run.ready")" --workload=synthetic \
      --input_len="$input_len" --output_len=2 --ignore_eos --concurrency=1 \
      --num_requests="$requests" --output_json="$run.json" > "$run.loadtest" 2>&1 ||
      { tail -20 "$run.loadtest"; exit 1; }
    curl -sf "$(metrics_url "$run" prefill-0)" > "$run.p.metrics"
    curl -sf "$(metrics_url "$run" decode-0)" > "$run.d.metrics"
    stop_cluster
    n=$(metric "$run.p.metrics" 'pd_worker_kv_transfer_seconds_count{direction="out"}')
    sum=$(metric "$run.p.metrics" 'pd_worker_kv_transfer_seconds_sum{direction="out"}')
    bytes=$(metric "$run.d.metrics" 'pd_worker_kv_transfer_bytes_total{direction="in"}')
    remote=$(metric "$run.d.metrics" 'pd_worker_prefills_total{where="remote"}')
    ttft=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["mean_ttft_ms"])' \
      "$run.json")
    awk -v p="$policy" -v n="$n" -v s="$sum" -v b="$bytes" -v t="$ttft" -v r="$remote" 'BEGIN {
      if (n == 0) { printf "%-8s no transfers recorded\n", p; exit 1 }
      printf "%-8s %9d %12.1f %14.2f %12.1f %12d\n", p, n, b / n / 1024, 1000 * s / n, t, r
    }'
  done
done
