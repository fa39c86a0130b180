#!/usr/bin/env bash
# Set up, build, start the local cluster on loopback (deploy/local/pd-local) and stream a sample
# generation with pd-client; then keep the cluster running until Ctrl-C.
#
# Environment: what scripts/setup.sh reads (PD_BUILD_DIR, PD_BUILD_TYPE, PD_CMAKE_ARGS, CI), and
#   PD_RUN_ONESHOT=1   stop the cluster after the sample and exit with pd-client's status (CI).
# Arguments are passed to deploy/local/pd-local, e.g. scripts/run.sh --aggregated, --model DIR.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"

for arg in "$@"; do
  case "$arg" in
    -h|--help)
      cat <<'EOF'
usage: scripts/run.sh [pd-local options]
Sets up and builds (scripts/setup.sh), starts deploy/local/pd-local in the background, streams
a sample generation with pd-client, and keeps the cluster running until Ctrl-C.
PD_RUN_ONESHOT=1: stop after the sample and exit with pd-client's status.
pd-local options (deploy/local/pd-local --help): --prefill N --decode M --aggregated
--model PATH --tokenizer PATH --port P --run_dir DIR --worker_arg ARG --router_arg ARG ...
EOF
      exit 0 ;;
  esac
done

pd_setup

client="$PD_BUILD_DIR/services/client/pd-client"
state_dir="$(mktemp -d "${TMPDIR:-/tmp}/pdserve-run-XXXXXX")"
ready_file="$state_dir/endpoint"

# pd-local runs in the background; a non-interactive shell starts it with SIGINT ignored, so it
# is always stopped with SIGTERM (it then stops the router, the workers and redis in order).
"$PD_ROOT/deploy/local/pd-local" --build_dir "$PD_BUILD_DIR" --ready_file "$ready_file" "$@" &
local_pid=$!

stop_cluster() {
  if kill -0 "$local_pid" 2>/dev/null; then
    kill -TERM "$local_pid" 2>/dev/null || true
  fi
  wait "$local_pid" 2>/dev/null || true
  rm -rf "$state_dir"
}
trap stop_cluster EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

pd_log "waiting for the local cluster"
while [ ! -s "$ready_file" ]; do
  if ! kill -0 "$local_pid" 2>/dev/null; then
    status=0
    wait "$local_pid" || status=$?
    pd_log "the local cluster failed to start (pd-local exit status $status; its messages are above)"
    exit 1
  fi
  sleep 0.2
done
endpoint="$(cat "$ready_file")"
openai_url="$(cat "$ready_file.openai" 2>/dev/null || true)"
model_id="$(curl -sf --max-time 2 "$openai_url/models" | python3 -c \
  'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])' 2>/dev/null || echo MODEL)"

prompt="Once upon a time"
pd_log "sample: pd-client --router=$endpoint --max_tokens=64 --echo \"$prompt\""
client_status=0
"$client" --router="$endpoint" --max_tokens=64 --echo "$prompt" || client_status=$?

if [ "${PD_RUN_ONESHOT:-0}" = 1 ]; then
  pd_log "PD_RUN_ONESHOT=1: stopping the cluster"
  trap - EXIT
  stop_cluster
  exit "$client_status"
fi

cat >&2 <<MSG
[pdserve] The local cluster keeps running on $endpoint. Send more prompts from another terminal:
[pdserve]   $client --router=$endpoint --max-tokens 64 "Lily and Ben went to the park"
[pdserve]   $client --router=$endpoint --json --temperature 0.8 --seed 7 "The cat sat"
[pdserve] The OpenAI-compatible HTTP API is on $openai_url (docs/openai.md):
[pdserve]   curl -sN $openai_url/completions -H 'Content-Type: application/json' \\
[pdserve]     -d '{"model": "$model_id", "prompt": "Once upon a time", "max_tokens": 32, "stream": true}'
[pdserve] Ctrl-C stops it (router, then workers, then redis).
MSG
trap 'trap - EXIT; stop_cluster; exit 0' INT TERM
status=0
wait "$local_pid" || status=$?
trap - EXIT
rm -rf "$state_dir"
exit "$status"
