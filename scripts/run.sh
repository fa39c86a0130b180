#!/usr/bin/env bash
# Set up, build, start the local cluster on loopback and stream a sample generation.
#
# Today the cluster is redis-server + pd-router; workers, the engine forward pass and the
# disaggregated path arrive with issues #3 and #5, and this script then streams a generation.
# Until then it starts what exists, checks it end to end, says what is missing, and stops
# everything (or keeps it running with --serve until Ctrl-C).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"

serve=0
for arg in "$@"; do
  case "$arg" in
    --serve) serve=1 ;;
    -h|--help)
      echo "usage: scripts/run.sh [--serve]   (--serve: keep the cluster up until Ctrl-C)"
      exit 0 ;;
    *) echo "scripts/run.sh: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

pd_setup

run_dir="$(mktemp -d "${TMPDIR:-/tmp}/pdserve-local-XXXXXX")"
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  pd_log "stopped; logs in $run_dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

redis_port=$(free_port)
pd_log "starting redis-server on 127.0.0.1:$redis_port"
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$run_dir" >"$run_dir/redis.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break
  sleep 0.05
done
redis-cli -p "$redis_port" ping >/dev/null || { pd_log "redis-server did not start"; exit 1; }

grpc_port=$(free_port)
metrics_port=$(free_port)
pd_log "starting pd-router: gRPC 127.0.0.1:$grpc_port, metrics 127.0.0.1:$metrics_port"
"$PD_BUILD_DIR/services/router/pd-router" --grpc_address="127.0.0.1:$grpc_port" \
  --metrics_address="127.0.0.1:$metrics_port" --redis_address="127.0.0.1:$redis_port" \
  >"$run_dir/router.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$metrics_port/healthz" >/dev/null 2>&1 && break
  sleep 0.05
done
curl -sf "http://127.0.0.1:$metrics_port/healthz" >/dev/null || {
  pd_log "pd-router did not start:"; cat "$run_dir/router.log" >&2; exit 1; }
pd_log "pd-router is up; its metrics:"
curl -sf "http://127.0.0.1:$metrics_port/metrics" | grep -E '^# (HELP|TYPE) pd_' | head -4 >&2

cat >&2 <<MSG

[pdserve] What runs today: redis-server and pd-router (health, ListModels, full request
[pdserve] validation) on loopback. Not there yet, so no sample generation is streamed:
[pdserve]   - the engine forward pass, paged KV cache and scheduler (issue #3; the llama2.c
[pdserve]     loader and tokenizer exist), and the pd-worker binary
[pdserve]   - the disaggregated request path, pd-client and the local launcher (issue #5)
[pdserve]   - KV transport (issue #4) and the tiering daemon (issue #6)
[pdserve] Generate on pd-router answers UNIMPLEMENTED naming these issues.
MSG

if [ "$serve" = 1 ]; then
  pd_log "serving until Ctrl-C (gRPC 127.0.0.1:$grpc_port)"
  wait "${pids[@]}"
fi
