#!/usr/bin/env bash
# Multi-turn chat on a two-node cluster, with and without remote restore (issue #19): pd-loadtest
# (workload multi_turn) against pd-router, each node a network namespace with its own pd-tierd
# and one aggregated pd-worker, Redis on a third:
#
#   node-a 10.213.0.1  redis-server, pd-router, pd-loadtest, curl (metrics)
#   node-b 10.213.0.2  pd-tierd + pd-worker --role both
#   node-c 10.213.0.3  pd-tierd + pd-worker --role both
#
# Every configuration starts a fresh cluster (empty pools, tiers and Redis) and runs the same
# seeded workload. Configurations (--configs, comma-separated; default all):
#   local          tierds without --peer_transport: a turn placed on the other node than its
#                  previous turn recomputes what its own node does not hold
#   remote         tierds with --peer_transport=ucx (UCX_TLS=tcp between the namespaces): such
#                  a turn fetches the blocks the other node's tierd holds, when cheaper
#   remote-wt      remote, and the workers write every block through to their tierd
#                  (--tier_write_through), so the tiers hold the hot prefixes too
#   remote-wt-credit  remote-wt, and pd-router credits blocks another node holds at their fetch
#                  cost (--remote_hit_weight=0.05: a block here fetches in ~1 ms and computes in
#                  ~40; --inflight_blocks_weight=1, as pd-routesim runs with remote fetch); not
#                  in the default list
# each with the router's --policy (--policies, default cache_aware,round_robin: round_robin
# scatters a conversation's turns over both nodes, the case a busy holder forces).
#
# Prints one table row per run (TTFT p50/p99/mean, prompt tokens saved = usage cached / prompt,
# blocks fetched from the other node) and writes each pd-loadtest JSON under --out.
#
# Safety: tests/deploy/netns_lib.sh (every process inside a namespace, no default route, UCX on
# tcp/eth0 only; a trap stops everything and deletes the namespaces). Needs root.
#
# usage: multiturn_netns_bench.sh --build-dir DIR --model HF_DIR [--out DIR] [--configs LIST]
#          [--policies LIST] [--requests N] [--kv_blocks N] [--reps N] [--keep-logs]
#          [-- pd-loadtest flags, after the script's own: the last value of a flag wins]
# --reps runs the whole matrix N times, every other time in reverse order, so that a machine
# getting slower or faster during the run does not favour one configuration.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(cd "$here/../../.." && pwd)
build="" model="" out="" keep=0
configs="local,remote,remote-wt" policies="cache_aware,round_robin" requests=64 kv_blocks=96
reps=1
extra=()
usage() { sed -n 2,29p "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --configs) configs=$2; shift 2 ;;
    --policies) policies=$2; shift 2 ;;
    --requests) requests=$2; shift 2 ;;
    --kv_blocks) kv_blocks=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --keep-logs) keep=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "multiturn_netns_bench.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
[ -n "$build" ] && [ -n "$model" ] || { usage >&2; exit 2; }
[ -d "$model" ] || { echo "multiturn_netns_bench.sh: --model $model is not a Hugging Face model directory (pd-make-model --preset small --out DIR makes one)" >&2; exit 2; }
[[ "$requests" =~ ^[1-9][0-9]*$ ]] || { echo "--requests must be a positive integer, got $requests" >&2; exit 2; }
[[ "$kv_blocks" =~ ^[1-9][0-9]*$ ]] || { echo "--kv_blocks must be a positive integer, got $kv_blocks" >&2; exit 2; }
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || { echo "--reps must be a positive integer, got $reps" >&2; exit 2; }
model=$(cd "$model" && pwd)
out=${out:-$build/multiturn-bench}
mkdir -p "$out"
out=$(cd "$out" && pwd)

# shellcheck source=tests/deploy/netns_lib.sh
source "$src/tests/deploy/netns_lib.sh"
log_tag=multiturn
metrics_node=a

router_bin="$build/services/router/pd-router"
worker_bin="$build/services/worker/pd-worker"
tierd_bin="$build/services/tierd/pd-tierd"
loadtest_bin="$build/loadtest/pd-loadtest"
require_built "$build" "$router_bin" "$worker_bin" "$tierd_bin" "$loadtest_bin"
require_tools ip redis-server curl python3
IFS=, read -ra config_list <<< "$configs"
IFS=, read -ra policy_list <<< "$policies"
for c in "${config_list[@]}"; do
  case "$c" in
    local|remote|remote-wt|remote-wt-credit) ;;
    *) fail "--configs: unknown configuration '$c' (local, remote, remote-wt, remote-wt-credit)" ;;
  esac
done
for p in "${policy_list[@]}"; do
  case "$p" in cache_aware|round_robin|random) ;; *) fail "--policies: unknown policy '$p'" ;; esac
done

tag="pdmt$$"
nodes=(a b c)
declare -A ip_of=([a]=10.213.0.1 [b]=10.213.0.2 [c]=10.213.0.3)
run="$build/multiturn-netns/$tag"
netns_start
A=${ip_of[a]}

# run_one CONFIG POLICY REP: a fresh cluster, the workload, the row.
run_one() {
  local config=$1 policy=$2 rep=$3 name="$1-$2-$3" x ip d p tierd_extra=() worker_extra=()
  local router_extra=()
  case "$config" in
    remote) tierd_extra=(--peer_transport=ucx) ;;
    remote-wt) tierd_extra=(--peer_transport=ucx); worker_extra=(--tier_write_through) ;;
    remote-wt-credit)
      tierd_extra=(--peer_transport=ucx)
      worker_extra=(--tier_write_through)
      router_extra=(--remote_hit_weight=0.05 --inflight_blocks_weight=1)
      ;;
  esac
  rm -rf "$run/redis" "$run"/nvme-*
  mkdir -p "$run/redis"
  start_in_ns a "redis-$name" redis-server --bind "$A" --port 6379 --protected-mode no --save '' \
    --appendonly no --dir "$run/redis"
  for x in b c; do
    ip=${ip_of[$x]}
    mkdir -p "$run/nvme-$x"
    start_in_ns "$x" "tierd-$x-$name" "$tierd_bin" --model="$model" --dram_mib=256 \
      --nvme_dir="$run/nvme-$x" --nvme_mib=512 --grpc_address=0.0.0.0:50071 \
      --redis_address="$A:6379" --redis_key_prefix="$tag" --node_name="$tag-$x" \
      --metrics_address="$ip:9102" --peer_transport_host="$ip" \
      --peer_advertise_address="$ip:50071" "${tierd_extra[@]}"
  done
  for x in b c; do
    wait_metric "http://${ip_of[$x]}:9102/metrics" pd_tierd_redis_connected 1 "tierd on node-$x ($name)"
  done
  for x in b c; do
    ip=${ip_of[$x]}
    start_in_ns "$x" "worker-$x-$name" "$worker_bin" --model="$model" --threads=1 \
      --kv_blocks="$kv_blocks" --tierd_address=127.0.0.1:50071 --role=both --transport=tcp \
      --transport_host="$ip" --node_name="$tag-$x" --worker_id="worker-$x" \
      --grpc_address="$ip:50062" --metrics_address="$ip:9103" --drain_timeout=5s \
      "${worker_extra[@]}"
  done
  start_in_ns a "router-$name" "$router_bin" --model="$model" --grpc_address="$A:50051" \
    --metrics_address="$A:9100" --decode_workers="${ip_of[b]}:50062,${ip_of[c]}:50062" \
    --policy="$policy" --redis_address="$A:6379" --redis_key_prefix="$tag" "${router_extra[@]}"
  wait_metric "http://$A:9100/metrics" pd_router_workers_healthy 2 "router seeing both workers ($name)"
  for x in b c; do
    wait_metric "http://${ip_of[$x]}:9102/metrics" pd_tierd_sessions 1 "node-$x's worker attached ($name)"
  done

  log "$name: pd-loadtest, $requests requests"
  in_ns a "$loadtest_bin" --target="$A:50051" --workload=multi_turn --num_conversations=8 \
    --num_turns=8 --system_prompt_len=64 --user_len=64 --output_len=32 --concurrency=2 \
    --num_requests="$requests" --seed=1 --progress=off --output_json="$out/$name.json" \
    "${extra[@]}" > "$run/loadtest-$name.log" 2>&1 ||
    fail "$name: pd-loadtest failed: $(tail -n 5 "$run/loadtest-$name.log")"

  local fetched=0 v decisions=""
  for x in b c; do
    v=$(metric a "http://${ip_of[$x]}:9102/metrics" pd_tierd_peer_fetched_blocks_total)
    fetched=$((fetched + ${v:-0}))
    for d in fetch recompute; do
      v=$(metric a "http://${ip_of[$x]}:9102/metrics" "pd_tierd_peer_decisions_total{decision=\"$d\"}")
      decisions+="$d=${v:-0} "
    done
  done
  python3 - "$out/$name.json" "$name" "$fetched" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
saved = j["usage_cached_tokens"] / j["usage_prompt_tokens"] if j["usage_prompt_tokens"] else 0
print(f"| {sys.argv[2]} | {j['completed']}/{j['num_requests']} | {j['median_ttft_ms']:.0f} | "
      f"{j['p99_ttft_ms']:.0f} | {j['mean_ttft_ms']:.0f} | {j['usage_prompt_tokens']} | "
      f"{j['usage_cached_tokens']} ({saved:.1%}) | {sys.argv[3]} |")
PY
  log "$name: peer decisions (b then c): $decisions"
  # Nothing leaks: once the load is done no tierd pins blocks for a peer read.
  for x in b c; do
    v=$(metric a "http://${ip_of[$x]}:9102/metrics" pd_tierd_peer_pinned_blocks)
    [ "${v:-0}" = 0 ] || fail "$name: node-$x's tierd still pins $v blocks for peer reads"
  done
  for p in "router-$name" "worker-b-$name" "worker-c-$name" "tierd-b-$name" "tierd-c-$name" "redis-$name"; do
    stop "$p"
  done
}

echo "| config-policy-rep | ok/requests | TTFT p50 ms | TTFT p99 ms | TTFT mean ms | prompt tokens | cached tokens (saved) | blocks fetched from the other node |"
echo "|---|---|---|---|---|---|---|---|"
runs=()
for pol in "${policy_list[@]}"; do
  for cfg in "${config_list[@]}"; do
    runs+=("$cfg $pol")
  done
done
# shellcheck disable=SC2086  # "$cfg $pol" splits into run_one's two arguments
for rep in $(seq 1 "$reps"); do
  if [ $((rep % 2)) = 1 ]; then
    for r in "${runs[@]}"; do run_one $r "$rep"; done
  else
    for ((i = ${#runs[@]} - 1; i >= 0; i--)); do run_one ${runs[$i]} "$rep"; done
  fi
done
