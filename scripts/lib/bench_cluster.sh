# Shared by the hand-off benchmarks (scripts/bench_*_handoff.sh): start and stop a local
# cluster (pd-local, no tiers) and read its metrics. Source it after setting `build` (the build
# directory) and `here` (the repository root); it sets `cluster` (pd-local's pid, "" when none)
# and stops a running cluster and removes `work` on exit.

cluster=""
work=$(mktemp -d /tmp/pd-bench-cluster.XXXXXX)
trap 'kill "$cluster" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT

# The value of metric line NAME (exact, labels included) in file FILE, or 0.
metric() { awk -v n="$2" '$1 == n { print $2; found = 1 } END { if (!found) print 0 }' "$1"; }

# start_cluster RUN MODEL [PD_LOCAL_ARGS...]: 1 prefill + 1 decode worker serving MODEL, run
# directory RUN (its address in RUN.ready, its log in RUN.log); exits the script if it does not
# come up within two minutes.
start_cluster() {
  local run=$1 model=$2
  shift 2
  "$here/deploy/local/pd-local" --build_dir "$build" --model "$model" --prefill 1 --decode 1 \
    --no_tierd --port 0 --run_dir "$run" --ready_file "$run.ready" "$@" > "$run.log" 2>&1 &
  cluster=$!
  for _ in $(seq 1 600); do [ -s "$run.ready" ] && break; sleep 0.2; done
  [ -s "$run.ready" ] || { echo "pd-local did not start:"; tail -20 "$run.log"; exit 1; }
}

# metrics_url RUN WORKER: the /metrics address of WORKER (e.g. prefill-0) in cluster RUN.
metrics_url() { awk -v w="$2" '$1 == w && $3 == "metrics" { print $4 }' "$1/cluster.txt"; }

# stop_cluster: SIGTERM (SIGINT is ignored by background jobs of a script), then wait.
stop_cluster() {
  kill -TERM "$cluster"
  wait "$cluster" || true
  cluster=""
}
