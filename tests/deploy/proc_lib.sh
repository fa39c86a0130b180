# shellcheck shell=bash
# proc_lib.sh: stopping what a test script started, shared by the deploy tests and benches that
# run real processes (netns_lib.sh, image_runtime_test.sh). Sourced, not run.

# stop_pids PID...: SIGTERM to each, up to 10 s for them to exit, then SIGKILL; reaps them.
stop_pids() {
  local pid alive
  for pid in "$@"; do kill -TERM "$pid" 2>/dev/null; done
  for _ in $(seq 1 50); do
    alive=0
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.2
  done
  for pid in "$@"; do kill -KILL "$pid" 2>/dev/null; done
  wait 2>/dev/null
}
