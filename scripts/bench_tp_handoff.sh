#!/usr/bin/env bash
# The prefill -> decode KV hand-off between workers of different tensor-parallel sizes (issue
# #36, docs/benchmarks.md "Tensor parallelism on the CPU"): for each prefill/decode TP pair, a
# local cluster (pd-local, no tiers) serves the same synthetic prompts, and the prefill worker's
# pd_worker_kv_transfer_seconds{direction="out"} and pd_worker_kv_transfer_bytes_total give the
# time and bytes of every hand-off. The 1 -> 1 pair is the ceiling the others are compared with
# (same bytes, same transport).
#
# usage: scripts/bench_tp_handoff.sh MODEL_DIR [INPUT_LEN] [REQUESTS] [PAIRS...]
#   MODEL_DIR  a Hugging Face model (e.g. pd-make-model --preset small --out /tmp/small)
#   INPUT_LEN  prompt tokens (default 1024); REQUESTS per pair (default 12)
#   PAIRS      "P:D" tensor-parallel sizes (default: 1:1 1:2 2:1 1:1 1:2 2:1); a size with an
#              "r" (e.g. 1:2r) runs that worker with --tp_kv_pools=per_rank
# Environment: BUILD_DIR (default build), KV_BLOCKS (each worker's pool, default 512),
# EXTRA_ARGS (more pd-local arguments, e.g.
# --worker_arg=--transport=tcp). Prints one line per pair: the transfers (posting to completion,
# on the prefill worker, which includes its gather with per-rank pools), and with per-rank pools
# the staging copies' mean ms a transfer on each side (out: the prefill worker's gather, in: the
# decode worker's scatter after arrival, pd_worker_kv_staging_copy_seconds_total).
set -euo pipefail

[ $# -ge 1 ] || { sed -n 2,15p "$0"; exit 2; }
model=$1
input_len=${2:-1024}
requests=${3:-12}
shift $(($# < 3 ? $# : 3))
pairs=("$@")
[ ${#pairs[@]} -gt 0 ] || pairs=(1:1 1:2 2:1 1:1 1:2 2:1)
build=${BUILD_DIR:-build}
here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib/bench_cluster.sh
. "$here/scripts/lib/bench_cluster.sh"

printf '%-8s %10s %10s %12s %12s %10s %10s %10s\n' pair transfers MiB "mean ms" "GB/s" "vs 1:1" \
  "out ms" "in ms"
base=""
for pair in "${pairs[@]}"; do
  p=${pair%%:*}
  d=${pair##*:}
  ranks=()
  [ "${p%r}" = "$p" ] || ranks+=(--prefill_arg=--tp_kv_pools=per_rank)
  [ "${d%r}" = "$d" ] || ranks+=(--decode_arg=--tp_kv_pools=per_rank)
  p=${p%r}
  d=${d%r}
  run="$work/$p-$d-$RANDOM"
  start_cluster "$run" "$model" --worker_arg=--kv_blocks="${KV_BLOCKS:-512}" ${EXTRA_ARGS:-} \
    --prefill_arg=--tensor_parallel="$p" --decode_arg=--tensor_parallel="$d" \
    ${ranks[@]+"${ranks[@]}"}
  "$build/loadtest/pd-loadtest" --target="$(cat "$run.ready")" --workload=synthetic \
    --input_len="$input_len" --output_len=2 --ignore_eos --concurrency=1 \
    --num_requests="$requests" > "$run.loadtest" 2>&1 ||
    { tail -20 "$run.loadtest"; exit 1; }
  curl -sf "$(metrics_url "$run" prefill-0)" > "$run.metrics"
  curl -sf "$(metrics_url "$run" decode-0)" > "$run.dmetrics"
  copy_out=$(metric "$run.metrics" 'pd_worker_kv_staging_copy_seconds_total{direction="out"}')
  copy_in=$(metric "$run.dmetrics" 'pd_worker_kv_staging_copy_seconds_total{direction="in"}')
  n=$(metric "$run.metrics" 'pd_worker_kv_transfer_seconds_count{direction="out"}')
  sum=$(metric "$run.metrics" 'pd_worker_kv_transfer_seconds_sum{direction="out"}')
  bytes=$(metric "$run.metrics" 'pd_worker_kv_transfer_bytes_total{direction="out"}')
  stop_cluster
  awk -v pair="$pair" -v n="$n" -v s="$sum" -v b="$bytes" -v base="$base" -v cout="$copy_out" \
    -v cin="$copy_in" 'BEGIN {
    if (n == 0) { printf "%-8s no transfers recorded\n", pair; exit 1 }
    gbs = b / s / 1e9
    printf "%-8s %10d %10.1f %12.2f %12.2f %10s %10.2f %10.2f\n", pair, n, b / 1048576,
           1000 * s / n, gbs, base == "" ? "-" : sprintf("%.2f", gbs / base), 1000 * cout / n,
           1000 * cin / n
  }'
  if [ "$pair" = 1:1 ]; then base=$(awk -v s="$sum" -v b="$bytes" 'BEGIN { print b / s / 1e9 }'); fi
done
