#!/usr/bin/env bash
# ctest deploy_multihost_netns (label slow): a pdserve cluster spread over four "hosts" that are
# network namespaces on this machine, joined by a bridge that lives in a fifth namespace:
#
#   node-a 10.213.0.1  redis-server (AUTH) + pd-router
#   node-b 10.213.0.2  pd-tierd + pd-worker --role prefill
#   node-c 10.213.0.3  pd-tierd + pd-worker --role decode
#   node-d 10.213.0.4  pd-client, curl, redis-cli (the checks)
#
# It streams the stories260K README's greedy text through the router, and checks that the
# prompt was prefilled on node-b and its KV moved to node-c over UCX on TCP, that each worker is
# attached to its own node's tierd, that blocks evicted on node-c reach node-c's tierd and are
# published to Redis on node-a, that a prompt gives the same text after its blocks were evicted,
# and that Redis answers across namespaces only with the password. Then remote restore (issue
# #19): with one aggregated worker per node behind its own router, a prompt cached in node-c's
# tierd is served on node-b from blocks node-b's tierd fetched from node-c's over the tcp KV
# transport, with the cold run's greedy text; again with node-c's tierd stalled (SIGSTOP: node-b
# recomputes, same text) and after node-c's tierd restarted (fetches resume).
#
# Safety: tests/deploy/netns_lib.sh (every process inside a namespace, no default route, UCX on
# tcp/eth0 only, a trap that stops everything and deletes the namespaces; 77 = not permitted).
#
# usage: multihost_netns_test.sh --build-dir DIR --model FILE --tokenizer FILE [--keep-logs]
set -uo pipefail

build="" model="" tokenizer="" keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --tokenizer) tokenizer=$2; shift 2 ;;
    --keep-logs) keep=1; shift ;;
    *) echo "multihost_netns_test.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$build" ] && [ -n "$model" ] && [ -n "$tokenizer" ] || {
  echo "usage: $0 --build-dir DIR --model FILE --tokenizer FILE" >&2; exit 2; }

# shellcheck source=tests/deploy/netns_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/netns_lib.sh"
log_tag=multihost

router_bin="$build/services/router/pd-router"
worker_bin="$build/services/worker/pd-worker"
tierd_bin="$build/services/tierd/pd-tierd"
client_bin="$build/services/client/pd-client"
require_built "$build" "$router_bin" "$worker_bin" "$tierd_bin" "$client_bin"
for f in "$model" "$tokenizer"; do
  [ -f "$f" ] || fail "$f is missing (../shared/models/stories260K)"
done
require_tools ip redis-server redis-cli curl

tag="pdmh$$"
nodes=(a b c d)
declare -A ip_of=([a]=10.213.0.1 [b]=10.213.0.2 [c]=10.213.0.3 [d]=10.213.0.4)
run="$build/multihost/$tag"

netns_start

# ---- the cluster -------------------------------------------------------------------------------
password="pw-$tag"
printf '%s\n' "$password" > "$run/redis.pw"
chmod 600 "$run/redis.pw"
mkdir -p "$run/redis" "$run/nvme-b" "$run/nvme-c"
A=${ip_of[a]} B=${ip_of[b]} C=${ip_of[c]}

start_in_ns a redis redis-server --bind "$A" --port 6379 --protected-mode no --save '' \
  --appendonly no --dir "$run/redis" --requirepass "$password"

# Each tierd listens on every address of its node: its workers dial 127.0.0.1:50071, the other
# node's tierd dials the node address it advertises for PeerRead (remote restore, tcp transport).
# stories260K computes a block faster than the namespaces move it, so the default cost policy
# would (rightly) recompute: the test fetches always, to exercise the path.
tierd_args=(--model="$model" --tokenizer="$tokenizer" --dram_mib=64 --nvme_mib=64
  --grpc_address=0.0.0.0:50071 --redis_address="$A:6379"
  --redis_password_file="$run/redis.pw" --redis_key_prefix="$tag" --peer_transport=tcp
  --peer_fetch_policy=always)
# Node names carry the tag: pd-tierd names its shared memory /pdserve-<node>-g2, and /dev/shm is
# the same for every namespace (and for other tests running at the same time).
start_tierd() {  # start_tierd NODE
  local x=$1 ip=${ip_of[$1]}
  start_in_ns "$x" "tierd-$x" "$tierd_bin" "${tierd_args[@]}" --node_name="$tag-$x" \
    --metrics_address="$ip:9102" --nvme_dir="$run/nvme-$x" --peer_transport_host="$ip" \
    --peer_advertise_address="$ip:50071"
}
start_tierd b
start_tierd c

# Workers re-attach to a tierd that comes up later (every second); starting them after their
# tierd keeps the checks below independent of that timing.
wait_metric "http://$B:9102/metrics" pd_tierd_redis_connected 1 "tierd on node-b"
wait_metric "http://$C:9102/metrics" pd_tierd_redis_connected 1 "tierd on node-c"

# Small KV pools, so that later requests evict earlier ones into the node's tierd; each worker
# reaches the tierd of its own node on the namespace's loopback (the chart: a node-local Service).
worker_args=(--model="$model" --tokenizer="$tokenizer" --threads=1 --transport=ucx
  --drain_timeout=5s --kv_blocks=12 --tierd_address=127.0.0.1:50071)
start_in_ns b prefill "$worker_bin" "${worker_args[@]}" --role=prefill --node_name="$tag-b" \
  --worker_id=prefill-b --grpc_address="$B:50061" --metrics_address="$B:9101" --transport_host="$B"
start_in_ns c decode "$worker_bin" "${worker_args[@]}" --role=decode --node_name="$tag-c" \
  --worker_id=decode-c --grpc_address="$C:50061" --metrics_address="$C:9101" --transport_host="$C"
start_in_ns a router "$router_bin" --model="$model" --tokenizer="$tokenizer" \
  --grpc_address="$A:50051" --metrics_address="$A:9100" \
  --decode_workers="$C:50061" --prefill_workers="$B:50061" \
  --redis_address="$A:6379" --redis_password_file="$run/redis.pw" --redis_key_prefix="$tag"

wait_metric "http://$A:9100/metrics" pd_router_workers_healthy 2 "router seeing both workers"
wait_metric "http://$B:9102/metrics" pd_tierd_sessions 1 "prefill worker attaching to node-b's tierd"
wait_metric "http://$C:9102/metrics" pd_tierd_sessions 1 "decode worker attaching to node-c's tierd"
log "router sees both workers; each worker is attached to its node's tierd"

# ---- checks -------------------------------------------------------------------------------------
passed=0
check() { passed=$((passed + 1)); log "PASS $*"; }

expected="Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. She wanted to play with it, but it was too high."
in_ns d "$client_bin" --router="$A:50051" --wait_ready=60s --token_ids=1 --max_tokens=100 \
  --temperature=0 --timeout=60s > "$run/client.out" 2> "$run/client.err" ||
  fail "pd-client on node-d: $(tail -n 3 "$run/client.err")"
case "$(cat "$run/client.out")" in
  "$expected"*) check "greedy stories260K text streamed from node-a's router to node-d" ;;
  *) fail "unexpected generation: $(head -c 300 "$run/client.out")" ;;
esac

remote=$(metric d "http://$C:9101/metrics" 'pd_worker_prefills_total{where="remote"}')
[ -n "$remote" ] && awk -v v="$remote" 'BEGIN {exit !(v >= 1)}' ||
  fail "decode worker on node-c did no remote prefill (pd_worker_prefills_total{where=\"remote\"}=$remote)"
check "decode on node-c had its prompt prefilled on node-b ($remote remote prefill)"

sent=$(metric d "http://$B:9101/metrics" 'pd_worker_kv_transfer_bytes_total{direction="out"}')
[ -n "$sent" ] && awk -v v="$sent" 'BEGIN {exit !(v > 0)}' ||
  fail "prefill worker on node-b sent no KV bytes (pd_worker_kv_transfer_bytes_total{direction=\"out\"}=$sent)"
check "node-b sent $sent KV bytes to node-c over UCX (UCX_TLS=tcp)"
# The transport's own log names the UCX lanes it got: tcp on the namespaces' eth0, never shared
# memory (sysv/posix/cma would mean the KV did not cross the "network").
lane=$(grep -h "ucx connection .*data path" "$run"/*.log 2>/dev/null | head -n 1)
case "$lane" in
  *tcp/eth0*) ;;
  *) fail "no UCX connection over tcp/eth0 in the workers' logs: '${lane:-none}'" ;;
esac
case "$lane" in
  *sysv*|*posix*|*cma*) fail "UCX used shared memory between namespaces: $lane" ;;
esac
check "UCX lanes between the namespaces: ${lane#*] }"

# Tiers: later prompts evict earlier blocks from node-c's decode pool into node-c's tierd, which
# publishes them to Redis on node-a; the first prompt again must give the same text.
generate() {  # generate NAME PROMPT: greedy, 60 tokens, from node-d
  in_ns d "$client_bin" --router="$A:50051" --max_tokens=60 --temperature=0 --timeout=60s \
    "$2" > "$run/$1.out" 2> "$run/$1.err" || fail "pd-client $1: $(tail -n 3 "$run/$1.err")"
}
story="Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends and her dog."
generate first "$story"
generate other1 "The cat sat on the mat and looked at the big red ball. It wanted to play with the ball all day long."
generate other2 "Tom had a little boat. Every day he went to the lake with his dad to sail the boat on the water."
generate again "$story"
cmp -s "$run/first.out" "$run/again.out" ||
  fail "same prompt, different greedy text after evictions: '$(head -c 200 "$run/first.out")' vs '$(head -c 200 "$run/again.out")'"
check "the first prompt gives the same text after two others evicted it ($(grep -o 'cached_tokens=[0-9]*' "$run/again.err"))"

for x in b c; do
  url="http://${ip_of[$x]}:9102/metrics"
  [ "$(metric d "$url" pd_tierd_sessions)" = 1 ] || fail "node-$x's worker is not attached to node-$x's tierd (pd_tierd_sessions=$(metric d "$url" pd_tierd_sessions))"
  [ "$(metric d "$url" pd_tierd_redis_connected)" = 1 ] || fail "pd-tierd on node-$x is not connected to Redis on node-a"
done
check "each worker attached to its own node's tierd; both tierds connected to Redis on node-a"

stored=$(metric d "http://$C:9102/metrics" 'pd_tierd_stored_blocks_total{tier="dram"}')
published=$(metric d "http://$C:9102/metrics" pd_tierd_redis_published_total)
awk -v s="${stored:-0}" -v p="${published:-0}" 'BEGIN {exit !(s > 0 && p > 0)}' ||
  fail "node-c's tierd stored ${stored:-0} evicted blocks and published ${published:-0} to Redis"
keys=$(in_ns d env REDISCLI_AUTH="$password" redis-cli -h "$A" -p 6379 --scan --pattern "$tag*" | wc -l)
[ "$keys" -gt 0 ] || fail "no key with prefix $tag in Redis on node-a"
check "node-c's tierd stored $stored evicted blocks and published $published entries ($keys keys) to Redis on node-a"

pong=$(in_ns d env REDISCLI_AUTH="$password" redis-cli -h "$A" -p 6379 ping 2>&1)
[ "$pong" = PONG ] || fail "redis-cli with the password from node-d: $pong"
noauth=$(in_ns d redis-cli -h "$A" -p 6379 ping 2>&1)
case "$noauth" in
  *NOAUTH*) check "Redis on node-a answers node-d only with the password" ;;
  *) fail "redis without the password answered: $noauth" ;;
esac

# ---- remote restore (issue #19): a prompt cached on node-c is served on node-b ----------------
# Two aggregated workers, one per node, each behind its own router on node-a. A prompt generated
# on node-c and evicted into node-c's tierd is then sent to node-b: node-b's tierd fetches its
# blocks from node-c's tierd over the tcp KV transport, and the text must equal the cold run's.
stop router
stop decode
stop prefill
agg_args=(--model="$model" --tokenizer="$tokenizer" --threads=1 --drain_timeout=5s --kv_blocks=12
  --tierd_address=127.0.0.1:50071 --role=both --transport=tcp)
start_in_ns b worker-b "$worker_bin" "${agg_args[@]}" --node_name="$tag-b" --worker_id=agg-b \
  --grpc_address="$B:50062" --metrics_address="$B:9103" --transport_host="$B"
start_in_ns c worker-c "$worker_bin" "${agg_args[@]}" --node_name="$tag-c" --worker_id=agg-c \
  --grpc_address="$C:50062" --metrics_address="$C:9103" --transport_host="$C"
start_in_ns a router-c "$router_bin" --model="$model" --tokenizer="$tokenizer" \
  --grpc_address="$A:50052" --metrics_address="$A:9104" --decode_workers="$C:50062"
start_in_ns a router-b "$router_bin" --model="$model" --tokenizer="$tokenizer" \
  --grpc_address="$A:50053" --metrics_address="$A:9105" --decode_workers="$B:50062"
wait_metric "http://$A:9104/metrics" pd_router_workers_healthy 1 "router-c seeing node-c's worker"
wait_metric "http://$A:9105/metrics" pd_router_workers_healthy 1 "router-b seeing node-b's worker"

gen_via() {  # gen_via PORT NAME PROMPT: greedy, 60 tokens, through the router on node-a:PORT
  in_ns d "$client_bin" --router="$A:$1" --max_tokens=60 --temperature=0 --timeout=60s \
    "$3" > "$run/$2.out" 2> "$run/$2.err" || fail "pd-client $2: $(tail -n 3 "$run/$2.err")"
}
counter() {  # counter URL NAME: a metric's value, 0 when absent
  local v
  v=$(metric d "$1" "$2")
  echo "${v:-0}"
}
# cache_on_c NAME PROMPT: the cold run on node-c, then two prompts that evict it from node-c's
# pool into node-c's tierd.
cache_on_c() {
  local before got pending published_before published
  before=$(counter "$TC" 'pd_tierd_stored_blocks_total{tier="dram"}')
  published_before=$(counter "$TC" pd_tierd_redis_published_total)
  gen_via 50052 "$1-cold" "$2"
  gen_via 50052 "$1-evict1" "A small bird lived in a tall tree near the river. Every morning it sang a happy song for the $1 fish."
  gen_via 50052 "$1-evict2" "The old man planted seeds in his garden. After the rain, green $1 plants grew everywhere he looked."
  # The worker offers evicted blocks in the background and tierd publishes them to Redis from its
  # index thread: wait until node-c's tierd stored new blocks and has nothing left to publish.
  for _ in $(seq 1 100); do
    got=$(counter "$TC" 'pd_tierd_stored_blocks_total{tier="dram"}')
    pending=$(counter "$TC" pd_tierd_redis_pending_updates)
    awk -v g="$got" -v b="$before" -v p="$pending" 'BEGIN {exit !(g > b && p == 0)}' && break
    sleep 0.1
  done
  awk -v g="$got" -v b="$before" 'BEGIN {exit !(g > b)}' ||
    fail "$1: node-c's tierd stored no evicted block ($before -> $got)"
  # The last batch leaves the pending count before its Redis round trip ends: wait until the
  # entries published cover the blocks stored (a loaded machine took longer than a fixed 0.3 s
  # once, and node-b then found nothing to fetch).
  for _ in $(seq 1 100); do
    published=$(counter "$TC" pd_tierd_redis_published_total)
    awk -v p="$published" -v pb="$published_before" -v g="$got" -v b="$before" \
      'BEGIN {exit !(p - pb >= g - b)}' && break
    sleep 0.1
  done
  sleep 0.1
}
same_text() {  # same_text NAME: the node-b run equals the cold node-c run
  cmp -s "$run/$1-cold.out" "$run/$1-b.out" ||
    fail "$1: node-b's text differs from the cold run: '$(head -c 200 "$run/$1-b.out")' vs '$(head -c 200 "$run/$1-cold.out")'"
}
TB="http://$B:9102/metrics" TC="http://$C:9102/metrics"

cache_on_c fetch "One day, a little boy named Ben found a shiny key under a big rock in the forest near his home."
gen_via 50053 fetch-b "One day, a little boy named Ben found a shiny key under a big rock in the forest near his home."
same_text fetch
fetched=$(counter "$TB" pd_tierd_peer_fetched_blocks_total)
served=$(counter "$TC" pd_tierd_peer_read_blocks_total)
awk -v f="$fetched" -v s="$served" 'BEGIN {exit !(f > 0 && f == s)}' ||
  fail "remote restore: node-b fetched $fetched blocks, node-c served $served"
restored=$(counter "http://$B:9103/metrics" pd_worker_tier_restored_blocks_total)
awk -v r="$restored" -v f="$fetched" 'BEGIN {exit !(r >= f)}' ||
  fail "node-b's worker restored $restored blocks, fewer than the $fetched fetched"
[ "$(counter "$TC" pd_tierd_peer_pinned_blocks)" = 0 ] || fail "node-c's tierd still pins blocks for peer reads"
check "a prompt cached on node-c was served on node-b with $fetched blocks fetched from node-c's tierd; same greedy text as the cold run"

# The holder stalls (SIGSTOP) during the next fetch: node-b gives up within its fetch timeout
# and recomputes; the text is the same.
cache_on_c stall "Mia had a red kite with a long tail. She ran up the hill so the wind could lift it into the sky."
failures=$(counter "$TB" pd_tierd_peer_fetch_failures_total)
stop_pid=$(awk '$1 == "tierd-c" {print $2}' "$run/pids" | tail -n 1)
kill -STOP "$stop_pid"
gen_via 50053 stall-b "Mia had a red kite with a long tail. She ran up the hill so the wind could lift it into the sky."
kill -CONT "$stop_pid"
same_text stall
after=$(counter "$TB" pd_tierd_peer_fetch_failures_total)
awk -v a="$after" -v b="$failures" 'BEGIN {exit !(a > b)}' ||
  fail "node-b's fetch from the stalled node-c did not fail ($b -> $a)"
check "node-c's tierd stalled mid-fetch: node-b recomputed, same text ($failures -> $after failed fetches)"

# node-c's tierd restarts (DRAM lost; Redis resynced from what it holds): its worker re-attaches
# at its next call (cache_on_c checks that the evicted blocks reach the new tierd), and fetches
# from it resume.
stop tierd-c
start_tierd c
wait_metric "$TC" pd_tierd_redis_connected 1 "restarted tierd on node-c"
cache_on_c again "Sam and his sister built a tall castle of sand by the sea, and then a wave came and took it away."
gen_via 50053 again-b "Sam and his sister built a tall castle of sand by the sea, and then a wave came and took it away."
same_text again
refetched=$(counter "$TB" pd_tierd_peer_fetched_blocks_total)
awk -v a="$refetched" -v b="$fetched" 'BEGIN {exit !(a > b)}' ||
  fail "no fetch from node-c's restarted tierd (fetched blocks $fetched -> $refetched)"
check "node-c's tierd restarted: the index was resynced and node-b fetched from it again ($fetched -> $refetched blocks)"

echo "$passed passed, 0 failed"
