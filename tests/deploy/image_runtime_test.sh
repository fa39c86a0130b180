#!/usr/bin/env bash
# ctest deploy_image_runtime (label slow): builds the CPU runtime image (the tag the Helm chart
# names) and checks it from the inside, as the chart will run it. By default the five binaries are
# compiled CPU-only beside the test's build tree (ccache makes that a minute or two after the
# main build) and scripts/images.sh --prebuilt builds runtime-cpu.Dockerfile around them (its
# build stage skips the compile for a BUILD_IMAGE carrying them with the /src/build/PREBUILT
# marker; the runtime stage -- Debian base, packages, user, paths -- is what a registry user's
# `docker build` gets; only where the binaries were compiled differs). --compile-in-image builds
# the way a registry user does, compiling in the build image (~45 min cold on 2 cores). Checks:
#   - every binary in /usr/local/bin starts (--help prints its usage);
#   - commands run as the image's unprivileged USER 65532 (`id -u` inside);
#   - ldd finds every shared library of the binaries and of UCX's transport modules (loaded with
#     dlopen at run time, so a missing one would show only when a transport is chosen);
#   - a cluster made of the image's binaries -- pd-tierd, a prefill worker, a decode worker and
#     pd-router on free 127.0.0.1 ports, each chrooted into the image's root as uid 65532 --
#     streams the stories260K README's greedy text to the image's pd-client, the prompt prefilled
#     on the prefill worker and its KV moved to the decode worker over UCX.
# redis-server comes from this machine (Debian 12's, as in every e2e test): the chart runs Redis
# from its own image (redis.bundled.image), never from pdserve's, which carries only pdserve.
#
# The first three checks use `buildah run --isolation chroot` (the image's config: USER, PATH);
# the cluster runs from `buildah mount` with chroot --userspec, so that its processes are this
# script's children and can be stopped by pid. Every process it starts is stopped on exit (trap),
# the mounts it made are unmounted and checked gone, the working container is removed.
#
# Skips (77) only where the machine cannot do it at all: not root (buildah's system storage,
# chroot). In CI (CI=true) that is a failure instead. Bounded: the CPU-only compile and the image
# build each by --build-timeout (default 1200 s; a cold machine debootstraps the base once, ~2
# min), every later step by its own timeout.
#
# usage: image_runtime_test.sh --source-dir DIR --build-dir DIR --model FILE --tokenizer FILE
#          [--build-timeout S] [--no-build] [--compile-in-image] [--keep-logs]
# --no-build: check the image as it is (no scripts/images.sh run), e.g. while changing this test.
set -uo pipefail

src="" build="" model="" tokenizer="" keep=0 build_timeout=1200 no_build=0 compile_in_image=0
while [ $# -gt 0 ]; do
  case "$1" in
    --source-dir) src=$2; shift 2 ;;
    --build-dir) build=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --tokenizer) tokenizer=$2; shift 2 ;;
    --build-timeout) build_timeout=$2; shift 2 ;;
    --no-build) no_build=1; shift ;;
    --compile-in-image) compile_in_image=1; shift ;;
    --keep-logs) keep=1; shift ;;
    *) echo "image_runtime_test.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$src" ] || [ -z "$build" ] || [ -z "$model" ] || [ -z "$tokenizer" ]; then
  echo "usage: $0 --source-dir DIR --build-dir DIR --model FILE --tokenizer FILE [--build-timeout S] [--no-build] [--compile-in-image] [--keep-logs]" >&2
  exit 2
fi

log() { echo "[image] $* (+$((SECONDS - t0)) s)"; }
fail() { echo "FAIL: $*"; exit 1; }
skip() {
  if [ "${CI:-}" = true ]; then fail "$* (CI must run this test)"; fi
  echo "SKIPPED: $*"
  exit 77
}
t0=$SECONDS

for f in "$model" "$tokenizer"; do
  [ -f "$f" ] || fail "$f is missing (../shared/models/stories260K)"
done
for tool in redis-server curl timeout chroot; do
  command -v "$tool" >/dev/null || fail "$tool not found (scripts/setup.sh installs it)"
done
[ "$(id -u)" = 0 ] || skip "building and entering images needs root (buildah's system storage, chroot); run as root"

image=$(bash "$src/scripts/images.sh" --list | awk '$1 == "runtime-cpu" {print $2}')
[ -n "$image" ] || fail "scripts/images.sh --list names no runtime-cpu image"
run="$build/image-test/run$$"
mkdir -p "$run"

# shellcheck source=tests/deploy/proc_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/proc_lib.sh"
pids=() ctr="" mnt="" mounts=()
cleanup() {
  local rc=$?
  stop_pids "${pids[@]}"
  # Our mounts, innermost first; then buildah's own (the container's root).
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    umount "${mounts[$i]}" 2>/dev/null || umount -l "${mounts[$i]}" 2>/dev/null
  done
  if [ -n "$ctr" ]; then
    buildah umount "$ctr" >/dev/null 2>&1
    buildah rm "$ctr" >/dev/null 2>&1
  fi
  rm -f /dev/shm/pdserve-"pdimg$$"-*   # a tierd killed before its own clean-up leaves its pool
  if [ -n "$mnt" ] && grep -qF " $mnt" /proc/mounts; then
    echo "FAIL: mounts left behind under $mnt:"
    grep -F " $mnt" /proc/mounts
    [ "$rc" -ne 0 ] || rc=1
  fi
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then
    for f in "$run"/*.log; do
      [ -f "$f" ] || continue
      case "$f" in */help-*) continue ;; esac   # usage texts
      echo "---- tail of $(basename "$f")"
      tail -n 25 "$f"
    done
  fi
  if [ "$keep" = 0 ] && { [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ]; }; then
    rm -rf "$run"
    rmdir "$build/image-test" 2>/dev/null
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- the image ---------------------------------------------------------------------------------
t=$SECONDS
if [ "$no_build" = 1 ]; then
  log "--no-build: checking $image as it is"
elif [ "$compile_in_image" = 1 ]; then
  log "building $image with scripts/images.sh --only runtime-cpu (log: $run/images.log)"
  timeout --kill-after=30 "$build_timeout" bash "$src/scripts/images.sh" --only runtime-cpu \
    --step-timeout "$build_timeout" > "$run/images.log" 2>&1
  rc=$?
  grep '^\[images\]' "$run/images.log" | sed 's/^/    /'
  [ "$rc" -ne 124 ] || fail "scripts/images.sh did not finish within $build_timeout s: a cold machine (no cached base, build image or ccache) needs ~45 min once; what it built is kept, so run the test again or warm up with: scripts/images.sh --only runtime-cpu"
  [ "$rc" -eq 0 ] || fail "scripts/images.sh --only runtime-cpu (exit $rc)"
else
  # The five binaries compiled CPU-only on this machine, beside the test's own build tree (same
  # depth, same compiler flags: ccache serves all but the few files that read build_config.h),
  # then runtime-cpu.Dockerfile around them (scripts/images.sh --prebuilt).
  cpu_build="${build%/}-image-cpu"
  # As scripts/setup.sh sets them for the main build, so that the objects are shared.
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$src}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
  cache_var() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt" 2>/dev/null; }
  build_type=$(cache_var CMAKE_BUILD_TYPE)
  werror=$(cache_var PD_WERROR)
  log "compiling the CPU-only binaries in $cpu_build (log: $run/cpu-build.log)"
  # shellcheck disable=SC2016  # $1..$4 expand in the inner bash
  if ! timeout --kill-after=30 "$build_timeout" bash -c '
      cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE="$3" -DPD_WERROR="$4" \
        -DPD_ENABLE_CUDA=OFF -DPD_BUILD_TESTS=OFF &&
      cmake --build "$2" --target pd-router pd-worker pd-tierd pd-client pd-loadtest' _ \
      "$src" "$cpu_build" "${build_type:-RelWithDebInfo}" "${werror:-OFF}" \
      > "$run/cpu-build.log" 2>&1; then
    fail "the CPU-only build in $cpu_build failed or took over $build_timeout s: $(tail -n 5 "$run/cpu-build.log")"
  fi
  log "building $image around them: scripts/images.sh --only runtime-cpu --prebuilt (log: $run/images.log)"
  timeout --kill-after=30 "$build_timeout" bash "$src/scripts/images.sh" --only runtime-cpu \
    --prebuilt "$cpu_build" --step-timeout "$build_timeout" > "$run/images.log" 2>&1
  rc=$?
  grep '^\[images\]' "$run/images.log" | sed 's/^/    /'
  [ "$rc" -ne 124 ] || fail "scripts/images.sh did not finish within $build_timeout s"
  [ "$rc" -eq 0 ] || fail "scripts/images.sh --only runtime-cpu --prebuilt (exit $rc)"
fi
log "image ready in $((SECONDS - t)) s"

ctr=$(buildah from --pull=never --quiet "$image") || fail "buildah from $image"
in_image() { timeout 60 buildah run --isolation chroot "$ctr" -- "$@"; }

passed=0
check() { passed=$((passed + 1)); log "PASS $*"; }

uid=$(in_image id -u 2>"$run/id.err") || fail "id -u in the image: $(cat "$run/id.err")"
[ "$uid" = 65532 ] || fail "commands in the image run as uid $uid, want 65532 (USER)"
check "the image runs commands as the unprivileged uid 65532"

bins=$(in_image sh -c 'ls /usr/local/bin') || fail "ls /usr/local/bin in the image"
for b in pd-router pd-worker pd-tierd pd-client pd-loadtest; do
  grep -qx "$b" <<< "$bins" || fail "/usr/local/bin/$b is not in the image"
done
for b in $bins; do
  # Abseil 20220623's --help prints the usage and exits 1; a missing library exits 127, a crash
  # with a signal (>= 128).
  in_image "/usr/local/bin/$b" --help > "$run/help-$b.log" 2>&1
  rc=$?
  { [ "$rc" -le 1 ] && grep -q -- "--helpfull" "$run/help-$b.log"; } ||
    fail "$b --help in the image: exit $rc, no usage: $(head -c 300 "$run/help-$b.log")"
done
check "every binary starts in the image ($(echo "$bins" | tr '\n' ' '))"

ucx_modules='/usr/lib/x86_64-linux-gnu/ucx/lib*.so.0'   # expanded in the image; Debian's libucx0: cma, ib, rdmacm
in_image sh -c "ldd /usr/local/bin/* $ucx_modules" > "$run/ldd.log" 2>&1 ||
  fail "ldd in the image: $(tail -n 3 "$run/ldd.log")"
if grep -q "not found" "$run/ldd.log"; then
  fail "libraries missing in the image: $(grep "not found" "$run/ldd.log" | sort -u | tr '\n' ' ')"
fi
check "ldd finds every library of the binaries and of UCX's $(in_image sh -c "ls $ucx_modules | wc -l") transport modules"

# ---- a cluster from the image's binaries ---------------------------------------------------------
mnt=$(buildah mount "$ctr") || fail "buildah mount"
bind() {  # bind SRC DEST_IN_IMAGE [ro]
  mount --bind "$1" "$mnt$2" || fail "mount --bind $1 $mnt$2"
  mounts+=("$mnt$2")
  if [ "${3:-}" = ro ]; then mount -o remount,bind,ro "$mnt$2" || fail "read-only $mnt$2"; fi
}
mount -t proc proc "$mnt/proc" || fail "mount proc on $mnt/proc"
mounts+=("$mnt/proc")
bind /sys /sys ro
bind /dev /dev
bind /dev/shm /dev/shm   # tierd's DRAM tier and UCX's shared memory
mkdir -p "$mnt/models"
cp "$model" "$mnt/models/stories260K.bin"
cp "$tokenizer" "$mnt/models/tok512.bin"

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# start NAME CMD...: in the image's root, as 65532:65532 with no supplementary groups, a clean
# environment; logged in $run/NAME.log. chroot execs the binary: the pid is the process's.
start() {
  local name=$1
  shift
  chroot --userspec=65532:65532 --groups=65532 "$mnt" \
    /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/tmp "$@" > "$run/$name.log" 2>&1 &
  pids+=("$!")
  echo "$name $!" >> "$run/pids"
}
metric() {  # metric PORT NAME_WITH_LABELS -> value or empty
  curl -sf --max-time 5 "http://127.0.0.1:$1/metrics" 2>/dev/null | awk -v m="$2" '$1 == m {print $2}'
}
wait_metric() {  # wait_metric PORT NAME VALUE WHAT: 120 s at most, failing fast when one died
  local got=""
  for _ in $(seq 1 240); do
    for pid in "${pids[@]}"; do
      kill -0 "$pid" 2>/dev/null || fail "$(awk -v p="$pid" '$2 == p {print $1}' "$run/pids") exited while waiting for $4"
    done
    got=$(metric "$1" "$2")
    [ "$got" = "$3" ] && return 0
    sleep 0.5
  done
  fail "$4: $2=$got after 120 s, want $3"
}

redis_port=$(free_port)
redis-server --bind 127.0.0.1 --port "$redis_port" --save '' --appendonly no --dir "$run" \
  > "$run/redis.log" 2>&1 &
pids+=("$!")
echo "redis $!" >> "$run/pids"
for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$redis_port") 2>/dev/null && break
  sleep 0.1
done

tag="pdimg$$"
M=/models/stories260K.bin T=/models/tok512.bin
tierd_port=$(free_port) tierd_mport=$(free_port)
start tierd pd-tierd --model=$M --tokenizer=$T --dram_mib=64 --node_name="$tag-node" \
  --grpc_address="127.0.0.1:$tierd_port" --metrics_address="127.0.0.1:$tierd_mport" \
  --redis_address="127.0.0.1:$redis_port" --redis_key_prefix="$tag"
wait_metric "$tierd_mport" pd_tierd_redis_connected 1 "pd-tierd connecting to Redis"

worker_args=(--model="$M" --tokenizer="$T" --threads=1 --transport=ucx --drain_timeout=5s
  --kv_blocks=64 --node_name="$tag-node" --tierd_address="127.0.0.1:$tierd_port"
  --transport_host=127.0.0.1)
prefill_port=$(free_port) prefill_mport=$(free_port)
decode_port=$(free_port) decode_mport=$(free_port)
start prefill pd-worker "${worker_args[@]}" --role=prefill --worker_id=prefill-0 \
  --grpc_address="127.0.0.1:$prefill_port" --metrics_address="127.0.0.1:$prefill_mport"
start decode pd-worker "${worker_args[@]}" --role=decode --worker_id=decode-0 \
  --grpc_address="127.0.0.1:$decode_port" --metrics_address="127.0.0.1:$decode_mport"
router_port=$(free_port) router_mport=$(free_port)
start router pd-router --model=$M --tokenizer=$T \
  --grpc_address="127.0.0.1:$router_port" --metrics_address="127.0.0.1:$router_mport" \
  --prefill_workers="127.0.0.1:$prefill_port" --decode_workers="127.0.0.1:$decode_port" \
  --redis_address="127.0.0.1:$redis_port" --redis_key_prefix="$tag"
wait_metric "$router_mport" pd_router_workers_healthy 2 "pd-router seeing both workers"
log "cluster up: redis :$redis_port, tierd :$tierd_port, prefill :$prefill_port, decode :$decode_port, router :$router_port"

# Each pdserve process runs in the image's root as 65532 (not in this machine's /).
while read -r name pid; do
  [ "$name" != redis ] || continue
  [ "$(readlink "/proc/$pid/root")" = "$mnt" ] || fail "$name (pid $pid) is not chrooted into the image ($(readlink "/proc/$pid/root"))"
  [ "$(awk '/^Uid:/ {print $2 $3}' "/proc/$pid/status")" = 6553265532 ] ||
    fail "$name (pid $pid) runs as $(awk '/^Uid:/ {print $2}' "/proc/$pid/status"), want 65532"
done < "$run/pids"
check "pd-tierd, both workers and pd-router run from the image's root as uid 65532"

expected="Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. She wanted to play with it, but it was too high."
timeout 120 chroot --userspec=65532:65532 --groups=65532 "$mnt" /usr/bin/env -i PATH=/usr/local/bin \
  pd-client --router="127.0.0.1:$router_port" --wait_ready=60s --token_ids=1 --max_tokens=100 \
  --temperature=0 --timeout=60s > "$run/client.out" 2> "$run/client.log" ||
  fail "the image's pd-client: $(tail -n 3 "$run/client.log")"
case "$(cat "$run/client.out")" in
  "$expected"*) ;;
  *) fail "unexpected generation: $(head -c 300 "$run/client.out")" ;;
esac
remote=$(metric "$decode_mport" 'pd_worker_prefills_total{where="remote"}')
awk -v v="${remote:-0}" 'BEGIN {exit !(v >= 1)}' ||
  fail "the decode worker did no remote prefill (pd_worker_prefills_total{where=\"remote\"}=${remote:-none})"
sent=$(metric "$prefill_mport" 'pd_worker_kv_transfer_bytes_total{direction="out"}')
awk -v v="${sent:-0}" 'BEGIN {exit !(v > 0)}' || fail "the prefill worker sent no KV bytes"
check "the image's binaries streamed the stories260K greedy text (prefilled remotely, $sent KV bytes over UCX)"

echo "$passed passed, 0 failed ($((SECONDS - t0)) s)"
