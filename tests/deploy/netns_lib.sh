# shellcheck shell=bash disable=SC2154  # tag, run, keep, nodes, ip_of, log_tag: set by the caller
# netns_lib.sh: "hosts" as network namespaces on this machine, joined by a bridge that lives in
# its own namespace, for the multi-host test (tests/deploy/multihost_netns_test.sh) and the
# two-node benchmark (services/tierd/bench/multiturn_netns_bench.sh). Sourced, not run.
#
# The caller sets, before netns_start:
#   tag      unique prefix of namespace names, Redis keys and /dev/shm names (e.g. pdmh$$)
#   nodes    array of node letters (a b c ...)
#   ip_of    associative array node -> address in 10.213.0.0/24
#   run      directory for logs (created) and the pid list
#   keep     1 = keep $run after a pass
#   log_tag  prefix of log lines
# and may set metrics_node (default d): the node that reads /metrics with curl.
#
# Safety (the machine is shared and must never send these packets out):
#   - every process runs inside a namespace through `ip netns exec` (in_ns, start_in_ns);
#     nothing in the root namespace connects to a namespace address, and the root namespace
#     gets no interface (both veth ends are made inside namespaces);
#   - no namespace has a default route or any route besides 10.213.0.0/24 (checked before
#     anything starts), so a packet for another address has nowhere to go;
#   - UCX_TLS=tcp and UCX_NET_DEVICES=eth0 (UCX would otherwise cross namespaces through shared
#     memory);
#   - a trap stops what was started (by pid) and deletes the namespaces on every exit;
#   - where network namespaces are not permitted, netns_start prints why and exits 77.

# shellcheck source=tests/deploy/proc_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/proc_lib.sh"

skip() { echo "SKIPPED: $*"; exit 77; }
log() { echo "[$log_tag] $*"; }
fail() { echo "FAIL: $*"; exit 1; }
ns() { echo "$tag-$1"; }
# require_built BUILD_DIR BIN...: every binary exists, else FAIL naming its build target.
require_built() {
  local dir=$1 b
  shift
  for b in "$@"; do
    [ -x "$b" ] || fail "$b is not built (cmake --build $dir --target $(basename "$b"))"
  done
}
# require_tools TOOL...: every tool is on PATH, else FAIL.
require_tools() {
  local t
  for t in "$@"; do
    command -v "$t" >/dev/null || fail "$t not found (scripts/setup.sh installs it)"
  done
}
pids=()
made_ns=()

# Every process goes through here: inside namespace $1, never in the root one.
in_ns() {
  local node=$1
  shift
  ip netns exec "$(ns "$node")" "$@"
}
start_in_ns() {  # start_in_ns NODE NAME CMD...: background, log in $run/NAME.log
  local node=$1 name=$2
  shift 2
  ip netns exec "$(ns "$node")" env UCX_TLS=tcp UCX_NET_DEVICES=eth0 "$@" \
    > "$run/$name.log" 2>&1 &
  pids+=("$!")
  echo "$name $!" >> "$run/pids"
}

netns_cleanup() {
  local rc=$?
  stop_pids "${pids[@]}"
  for n in "${made_ns[@]}"; do ip netns del "$n" 2>/dev/null; done
  rm -f /dev/shm/pdserve-"$tag"-*   # a tierd killed before its own clean-up leaves its pool
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then
    for f in "$run"/*.log; do
      [ -f "$f" ] || continue
      echo "---- tail of $(basename "$f")"
      tail -n 25 "$f"
    done
  fi
  # Logs stay for a failure (and with keep=1); a pass or a skip leaves nothing behind.
  if [ "$keep" = 0 ] && { [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ]; }; then
    rm -rf "$run"
    rmdir "$(dirname "$run")" 2>/dev/null
  fi
  exit "$rc"
}

# netns_start: checks that namespaces are permitted, then makes the bridge and one namespace per
# node with its address, and checks the routes. Installs the clean-up trap.
netns_start() {
  [ "$(id -u)" = 0 ] || skip "network namespaces need root (ip netns add); run as root"
  mkdir -p "$run"
  trap netns_cleanup EXIT
  trap 'exit 130' INT TERM
  local probe="$tag-probe" err n x existing routes
  local sw="$tag-sw"
  if ! err=$(ip netns add "$probe" 2>&1); then
    skip "ip netns add is not permitted here ($err)"
  fi
  if ! err=$(ip netns exec "$probe" ip link set lo up 2>&1); then
    ip netns del "$probe" 2>/dev/null
    skip "ip netns exec is not permitted here ($err)"
  fi
  ip netns del "$probe"
  for n in "$sw" $(for x in "${nodes[@]}"; do ns "$x"; done); do
    existing=$(ip netns list | awk '{print $1}')
    grep -qx -- "$n" <<< "$existing" && fail "namespace $n exists already"
  done
  ip netns add "$sw" || fail "ip netns add $sw"
  made_ns+=("$sw")
  ip -n "$sw" link set lo up
  ip -n "$sw" link add br0 type bridge || fail "bridge in $sw"
  ip -n "$sw" link set br0 up
  for x in "${nodes[@]}"; do
    n=$(ns "$x")
    ip netns add "$n" || fail "ip netns add $n"
    made_ns+=("$n")
    # Both ends are created inside namespaces: the root namespace never holds an interface.
    ip -n "$sw" link add "v$x" type veth peer name eth0 netns "$n" || fail "veth for $n"
    ip -n "$sw" link set "v$x" master br0 up
    ip -n "$n" link set lo up
    ip -n "$n" addr add "${ip_of[$x]}/24" dev eth0
    ip -n "$n" link set eth0 up
  done
  for x in "${nodes[@]}"; do
    n=$(ns "$x")
    [ -z "$(ip -n "$n" route show default)" ] || fail "$n has a default route"
    [ -z "$(ip -n "$n" -6 route show default)" ] || fail "$n has an IPv6 default route"
    routes=$(ip -n "$n" -4 route show | grep -v '^10\.213\.0\.0/24 ' || true)
    [ -z "$routes" ] || fail "$n has routes besides 10.213.0.0/24: $routes"
  done
  log "namespaces $sw, $(for x in "${nodes[@]}"; do printf '%s ' "$(ns "$x")"; done)up; no default routes"
}

metric() {  # metric NODE URL NAME_WITH_LABELS -> value or empty (curl runs on NODE)
  in_ns "$1" curl -sf --max-time 5 "$2" 2>/dev/null | awk -v m="$3" '$1 == m {print $2}'
}
# wait_metric URL NAME VALUE WHAT: bounded wait (120 s) for a metric, failing fast when one of
# our processes died.
wait_metric() {
  local got="" pid
  for _ in $(seq 1 240); do
    for pid in "${pids[@]}"; do
      kill -0 "$pid" 2>/dev/null || fail "$(awk -v p="$pid" '$2 == p {print $1}' "$run/pids") exited while waiting for $4"
    done
    got=$(metric "${metrics_node:-d}" "$1" "$2")
    [ "$got" = "$3" ] && return 0
    sleep 0.5
  done
  fail "$4: $2=$got after 120 s, want $3"
}
# stop NAME [SIGNAL]: stops a process started as NAME and forgets it (wait_metric checks the rest).
stop() {
  local pid p keep_pids=()
  pid=$(awk -v n="$1" '$1 == n {print $2}' "$run/pids" | tail -n 1)
  [ -n "$pid" ] || fail "stop: no process named $1"
  kill "-${2:-TERM}" "$pid" 2>/dev/null
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  for p in "${pids[@]}"; do [ "$p" = "$pid" ] || keep_pids+=("$p"); done
  pids=("${keep_pids[@]}")
}
