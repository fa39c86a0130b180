#!/usr/bin/env bash
# Builds pdserve's container images on this machine, without a Docker engine or a registry:
#
#   1. a Debian 12 base from the Debian mirror (debootstrap --variant=minbase bookworm, trimmed as
#      Docker's -slim images are), cached as a tarball and imported as a local image;
#   2. on a machine with the CUDA 13.0 toolkit at /usr/local/cuda-13.0: two local "cuda-files"
#      images holding this machine's toolkit files laid out as NVIDIA's nvidia/cuda devel and
#      runtime images have them, which cannot be pulled here (no registry);
#   3. deploy/docker/{build,runtime-cpu,runtime-cuda}.Dockerfile with `buildah bud --isolation
#      chroot`, the local images passed as build arguments (DEBIAN_IMAGE, CUDA_DEVEL_IMAGE,
#      CUDA_RUNTIME_IMAGE, BUILD_IMAGE): the Dockerfiles keep their public defaults, so a plain
#      `docker build` with a registry gets exactly what it got before.
#
# The images are tagged with the names the Helm chart uses (`--list`; tests/deploy checks that the
# chart names only these) and live in buildah's local storage (/var/lib/containers/storage;
# `buildah images`). Nothing is pushed. docs/deploy.md tells how to use them with a cluster.
#
# Caches (default ${XDG_CACHE_HOME:-~/.cache}/pdserve/images, or PD_IMAGES_CACHE, or --cache-dir):
#   base/     the debootstrap tarball, keyed by its recipe (suite, variant, mirror, trimming);
#   ccache/   mounted at /ccache into the runtime images' build stage: the Dockerfiles use it only
#             when that directory exists, which it never does in a plain docker build.
# An image is rebuilt only when its inputs changed (Dockerfile, sources, setup.sh, the images it
# builds on): each carries the hash of its inputs as the label io.pdserve.inputs.
#
# Needs root (debootstrap, buildah's storage); installs debootstrap and buildah when missing.
set -euo pipefail

PD_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# The images' version is the chart's appVersion: the chart's image tags must name what this builds.
PD_IMAGE_VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^" ]*\)"\{0,1\} *$/\1/p' "$PD_ROOT/helm/pdserve/Chart.yaml")

# name, Dockerfile, image: everything this script builds (`--list` prints it).
PD_IMAGES=(
  "build deploy/docker/build.Dockerfile pdserve/pdserve-build:${PD_IMAGE_VERSION}"
  "runtime-cpu deploy/docker/runtime-cpu.Dockerfile pdserve/pdserve-cpu:${PD_IMAGE_VERSION}"
  "runtime-cuda deploy/docker/runtime-cuda.Dockerfile pdserve/pdserve-cuda:${PD_IMAGE_VERSION}"
)

# The local stand-ins for the public base images (never pushed anywhere).
LOCAL_REPO=localhost/pdserve-local
SUITE=bookworm
MIRROR=http://deb.debian.org/debian
CUDA_ROOT=/usr/local/cuda-13.0   # the Dockerfiles copy this path from NVIDIA's images

usage() {
  cat <<EOF
usage: scripts/images.sh [options]

Builds the pdserve container images with buildah (no Docker engine, no registry):
$(for spec in "${PD_IMAGES[@]}"; do read -r n f i <<< "$spec"; printf '  %-13s %-40s %s\n' "$n" "$f" "$i"; done)

options:
  --only NAMES       comma-separated subset of: build,runtime-cpu,runtime-cuda (default: all);
                     what they build on is built first when missing or out of date
  --list             print "NAME IMAGE DOCKERFILE" for every image this script builds, and exit
  --cache-dir DIR    caches (default: \$PD_IMAGES_CACHE or ~/.cache/pdserve/images)
  --jobs N           compile jobs inside the image builds (default: nproc)
  --no-ccache        do not mount the ccache directory: compile as a plain docker build does
  --refresh-base     debootstrap the base again (a new Debian point release, security updates)
  --force            rebuild the named images even when their inputs did not change
  --step-timeout S   limit for each step in seconds (default: 3600)
  --no-install       fail instead of installing missing Debian packages (debootstrap, buildah)
  --prebuilt DIR     runtime-cpu only: take the five binaries from the CPU-only build tree DIR
                     (cmake -DPD_ENABLE_CUDA=OFF; DIR/services/worker/pd-worker, ...) instead of
                     compiling them in the build image: BUILD_IMAGE is then the base with the
                     binaries and the /src/build/PREBUILT marker, which makes the Dockerfile skip
                     its compile. No build image or CUDA files needed. The image test uses it.
  -h, --help         this text

Progress lines start with [images]; buildah's own output follows each build step.
EOF
}

log() { printf '[images] %s\n' "$*" >&2; }
die() { printf '[images] error: %s\n' "$*" >&2; exit 1; }

only="" list=0 jobs=$(nproc) use_ccache=1 refresh_base=0 force=0 install=1 step_timeout=3600
prebuilt=""
cache="${PD_IMAGES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pdserve/images}"
while [ $# -gt 0 ]; do
  case "$1" in
    --only) [ $# -ge 2 ] || die "--only needs a value"; only=$2; shift 2 ;;
    --list) list=1; shift ;;
    --cache-dir) [ $# -ge 2 ] || die "--cache-dir needs a value"; cache=$2; shift 2 ;;
    --jobs) [ $# -ge 2 ] || die "--jobs needs a value"; jobs=$2; shift 2 ;;
    --no-ccache) use_ccache=0; shift ;;
    --refresh-base) refresh_base=1; shift ;;
    --force) force=1; shift ;;
    --step-timeout) [ $# -ge 2 ] || die "--step-timeout needs a value"; step_timeout=$2; shift 2 ;;
    --no-install) install=0; shift ;;
    --prebuilt) [ $# -ge 2 ] || die "--prebuilt needs a value"; prebuilt=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done
[ -n "$PD_IMAGE_VERSION" ] || die "no appVersion in helm/pdserve/Chart.yaml"
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || die "--jobs wants a positive number, got '$jobs'"
[[ "$step_timeout" =~ ^[1-9][0-9]*$ ]] || die "--step-timeout wants seconds, got '$step_timeout'"

if [ "$list" = 1 ]; then
  for spec in "${PD_IMAGES[@]}"; do
    read -r n f i <<< "$spec"
    echo "$n $i $f"
  done
  exit 0
fi

# ---- what to build -----------------------------------------------------------------------------
declare -A image_of dockerfile_of want
for spec in "${PD_IMAGES[@]}"; do
  read -r n f i <<< "$spec"
  image_of[$n]=$i
  dockerfile_of[$n]=$f
done
IFS=, read -r -a names <<< "${only:-build,runtime-cpu,runtime-cuda}"
for n in "${names[@]}"; do
  [ -n "${image_of[$n]:-}" ] || die "--only: unknown image '$n' (build, runtime-cpu, runtime-cuda)"
  want[$n]=1
done
need_cuda=1   # the build image carries the toolkit (COPY --from the CUDA devel image)
# The binaries of the CPU image, as the build image's cmake lays them out under /src/build.
PREBUILT_BINS=(services/router/pd-router services/worker/pd-worker services/tierd/pd-tierd
  services/client/pd-client loadtest/pd-loadtest)
if [ -n "$prebuilt" ]; then
  [ "${names[*]}" = runtime-cpu ] || die "--prebuilt builds only runtime-cpu: add --only runtime-cpu"
  [ -d "$prebuilt" ] || die "--prebuilt $prebuilt: not a directory"
  prebuilt=$(cd "$prebuilt" && pwd)
  for b in "${PREBUILT_BINS[@]}"; do
    [ -x "$prebuilt/$b" ] || die "--prebuilt: $prebuilt/$b is missing (cmake --build $prebuilt --target $(basename "$b"))"
    if ldd "$prebuilt/$b" 2>/dev/null | grep -qE 'libcudart|libcublas|libnccl'; then
      die "--prebuilt: $prebuilt/$b links CUDA libraries: the CPU image needs a build configured with -DPD_ENABLE_CUDA=OFF"
    fi
  done
  need_cuda=0
fi

# ---- tools -----------------------------------------------------------------------------------
[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, buildah's system storage); run with sudo"
missing=()
for pkg in debootstrap buildah; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  [ "$install" = 1 ] || die "missing Debian packages: ${missing[*]} (apt-get install ${missing[*]})"
  log "installing ${missing[*]} (apt-get)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
mkdir -p "$cache/base" "$cache/ccache"
# One ccache for every image build; bounded (the host build's own cache is separate).
[ -f "$cache/ccache/ccache.conf" ] || printf 'max_size = 3G\n' > "$cache/ccache/ccache.conf"

start=$SECONDS
step() { log "$* (+$((SECONDS - start)) s)"; }
# Bounded: every long step runs under `timeout` (--step-timeout); callers die on failure.
bounded() {
  local rc=0
  timeout --kill-after=30 "$step_timeout" "$@" || rc=$?
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    log "timed out after ${step_timeout} s: $*"
  fi
  return "$rc"
}

image_exists() { buildah inspect --type image "$1" >/dev/null 2>&1; }
image_id() { buildah inspect --type image --format '{{.FromImageID}}' "$1" 2>/dev/null; }
image_label() {  # image_label IMAGE KEY
  buildah inspect --type image --format "{{index .OCIv1.Config.Labels \"$2\"}}" "$1" 2>/dev/null
}
sha() { sha256sum | cut -c1-16; }

# Working containers this script made, removed on any exit (their mounts with them). A failed
# or killed buildah bud leaves its stages' containers behind, each holding a multi-GB image:
# on failure, every container that appeared during this run goes too.
containers=()
containers_before=$(buildah containers -q 2>/dev/null | sort)
cleanup() {
  local rc=$? c
  for c in "${containers[@]}"; do
    [ -n "$c" ] || continue
    buildah umount "$c" >/dev/null 2>&1 || true
    buildah rm "$c" >/dev/null 2>&1 || true
  done
  if [ "$rc" -ne 0 ]; then
    for c in $(comm -13 <(echo "$containers_before") <(buildah containers -q 2>/dev/null | sort)); do
      buildah rm "$c" >/dev/null 2>&1 || true
    done
  fi
  if [ -n "${rootfs_tmp:-}" ] && [ -d "$rootfs_tmp" ]; then
    # A killed debootstrap leaves /proc and /sys mounted in its target: unmount before removing.
    awk -v r="$rootfs_tmp/" 'index($2, r) == 1 {print $2}' /proc/mounts | sort -r |
      while read -r m; do umount -l "$m" 2>/dev/null || true; done
    rm -rf --one-file-system "$rootfs_tmp"
  fi
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# Removes the other tags of a local repository (old cache keys): stale copies cost gigabytes.
drop_stale() {  # drop_stale REPO KEEP_IMAGE...
  local repo=$1 name
  shift
  while read -r name; do
    [ -n "$name" ] || continue
    case " $* " in *" $name "*) continue ;; esac
    log "removing the stale $name"
    buildah rmi "$name" >/dev/null 2>&1 || true
  done < <(buildah images --format '{{.Name}}:{{.Tag}}' 2>/dev/null | grep -F "$repo:" || true)
}

# ---- 1. the Debian base ----------------------------------------------------------------------
# What Docker's debian:*-slim images do on top of debootstrap (docker-debian-artifacts): no
# documentation, manuals or translations (copyright files stay), apt keeps no lists or packages.
SLIM_DPKG='path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*'
SLIM_APT='APT::Install-Recommends "false";
Acquire::Languages "none";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };'
# The official image's sources: the release, its updates and the security archive.
SOURCES="Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${MIRROR%/debian}/debian-security
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg"
base_key=$(printf '%s\n' "recipe 1" "$SUITE minbase amd64 $MIRROR" "$SLIM_DPKG" "$SLIM_APT" "$SOURCES" | sha)
base_tar="$cache/base/$SUITE-minbase-$base_key.tar"
base_image="$LOCAL_REPO/debian:$SUITE-minbase-$base_key"

make_base_tar() {
  rootfs_tmp=$(mktemp -d "$cache/base/rootfs.XXXXXX")
  step "debootstrap --variant=minbase $SUITE from $MIRROR into $rootfs_tmp"
  local t=$SECONDS
  bounded debootstrap --variant=minbase --arch=amd64 "$SUITE" "$rootfs_tmp" "$MIRROR" \
    > "$cache/base/debootstrap.log" 2>&1 ||
    die "debootstrap failed (log: $cache/base/debootstrap.log): $(tail -n 3 "$cache/base/debootstrap.log")"
  step "debootstrap took $((SECONDS - t)) s"
  printf '%s\n' "$SLIM_DPKG" > "$rootfs_tmp/etc/dpkg/dpkg.cfg.d/pdserve-slim"
  printf '%s\n' "$SLIM_APT" > "$rootfs_tmp/etc/apt/apt.conf.d/pdserve-slim"
  printf '%s\n' "$SOURCES" > "$rootfs_tmp/etc/apt/sources.list.d/debian.sources"
  rm -f "$rootfs_tmp/etc/apt/sources.list"
  # What the excludes would have kept out, had they been there from the start.
  find "$rootfs_tmp/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$rootfs_tmp/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$rootfs_tmp"/usr/share/{man,groff,info,lintian,linda,locale}/*
  rm -rf "$rootfs_tmp"/var/cache/apt/archives/*.deb "$rootfs_tmp"/var/lib/apt/lists/*
  tar -C "$rootfs_tmp" --numeric-owner -cf "$base_tar.part" .
  mv "$base_tar.part" "$base_tar"
  rm -rf "$rootfs_tmp"
  rootfs_tmp=""
  step "base tarball $base_tar ($(du -h "$base_tar" | cut -f1))"
}

if [ "$refresh_base" = 1 ]; then
  rm -f "$base_tar"
  buildah rmi "$base_image" >/dev/null 2>&1 || true
fi
if image_exists "$base_image"; then
  step "base image $base_image (cached)"
else
  [ -f "$base_tar" ] || make_base_tar
  step "importing $base_tar as $base_image, then apt-get upgrade (updates, security)"
  ctr=$(buildah from scratch)
  containers+=("$ctr")
  buildah add --quiet "$ctr" "$base_tar" / >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd bash --label "io.pdserve.base=debootstrap --variant=minbase $SUITE $MIRROR" "$ctr"
  bounded buildah run --isolation chroot "$ctr" -- sh -c \
    'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get -y -qq dist-upgrade >/dev/null && apt-get clean && rm -rf /var/lib/apt/lists/*' ||
    die "apt-get upgrade in the new base failed"
  buildah commit --quiet --rm "$ctr" "$base_image" >/dev/null
  containers=("${containers[@]/$ctr/}")
  step "base image $base_image"
fi

# ---- 2. CUDA files laid out as NVIDIA's images have them ---------------------------------------
cuda_devel_image="" cuda_runtime_image=""
make_cuda_images() {
  local nvcc="$CUDA_ROOT/bin/nvcc"
  [ -x "$nvcc" ] || die "the build image needs the CUDA 13.0 toolkit at $CUDA_ROOT (the Dockerfiles copy that path from nvidia/cuda:13.0.2-devel, which cannot be pulled here); $nvcc is missing"
  local inc lib
  inc=$(readlink -f "$CUDA_ROOT/targets/x86_64-linux/include")
  lib=$(readlink -f "$CUDA_ROOT/targets/x86_64-linux/lib")
  if [ ! -f "$inc/nccl.h" ] || ! compgen -G "$lib/libnccl.so.2*" >/dev/null; then
    die "NCCL is missing: want $inc/nccl.h and $lib/libnccl.so.2* beside the toolkit (NVIDIA's libnccl-dev)"
  fi
  local key
  key=$( (cd "$CUDA_ROOT" && find -L . -printf '%P %s %T@\n' 2>/dev/null | sort) | sha)
  cuda_devel_image="$LOCAL_REPO/cuda-files:13.0-devel-$key"
  cuda_runtime_image="$LOCAL_REPO/cuda-files:13.0-runtime-$key"
  if image_exists "$cuda_devel_image" && image_exists "$cuda_runtime_image"; then
    step "CUDA file images $cuda_devel_image, $cuda_runtime_image (cached)"
    return
  fi
  local ctr mnt t=$SECONDS
  step "CUDA devel files: the toolkit of $CUDA_ROOT (no cuDNN: NVIDIA's devel image has none) -> $cuda_devel_image"
  ctr=$(buildah from scratch)
  containers+=("$ctr")
  mnt=$(buildah mount "$ctr")
  local dst="$mnt$CUDA_ROOT"
  # nvidia/cuda: the real directories are targets/x86_64-linux/{include,lib}, with include and
  # lib64 links to them; NCCL (libnccl2, libnccl-dev) lives in /usr/include and the multiarch dir.
  mkdir -p "$dst/targets/x86_64-linux/include" "$dst/targets/x86_64-linux/lib" \
    "$mnt/usr/include" "$mnt/usr/lib/x86_64-linux-gnu"
  cp -a "$CUDA_ROOT/bin" "$CUDA_ROOT/nvvm" "$dst/"
  tar -C "$inc" --exclude='./nccl*' --exclude='./cudnn*' -cf - . | tar -C "$dst/targets/x86_64-linux/include" -xf -
  tar -C "$lib" --exclude='./libnccl*' --exclude='./libcudnn*' -cf - . | tar -C "$dst/targets/x86_64-linux/lib" -xf -
  ln -s targets/x86_64-linux/include "$dst/include"
  ln -s targets/x86_64-linux/lib "$dst/lib64"
  cp -a "$inc"/nccl*.h "$mnt/usr/include/"
  [ ! -d "$inc/nccl_device" ] || cp -a "$inc/nccl_device" "$mnt/usr/include/"
  cp -a "$lib"/libnccl.so* "$mnt/usr/lib/x86_64-linux-gnu/"
  buildah umount "$ctr" >/dev/null
  buildah config --label "io.pdserve.note=files of this machine's $CUDA_ROOT, not NVIDIA's image" "$ctr"
  bounded buildah commit --quiet --rm "$ctr" "$cuda_devel_image" >/dev/null || die "buildah commit $cuda_devel_image"
  containers=("${containers[@]/$ctr/}")
  step "CUDA runtime files: libcudart, libcublas, libcublasLt, libnccl -> $cuda_runtime_image"
  ctr=$(buildah from scratch)
  containers+=("$ctr")
  mnt=$(buildah mount "$ctr")
  mkdir -p "$mnt$CUDA_ROOT/targets/x86_64-linux/lib" "$mnt/usr/lib/x86_64-linux-gnu"
  cp -a "$lib"/libcudart.so.13* "$lib"/libcublas.so.13* "$lib"/libcublasLt.so.13* \
    "$mnt$CUDA_ROOT/targets/x86_64-linux/lib/"
  cp -a "$lib"/libnccl.so.2* "$mnt/usr/lib/x86_64-linux-gnu/"
  buildah umount "$ctr" >/dev/null
  buildah config --label "io.pdserve.note=files of this machine's $CUDA_ROOT, not NVIDIA's image" "$ctr"
  bounded buildah commit --quiet --rm "$ctr" "$cuda_runtime_image" >/dev/null || die "buildah commit $cuda_runtime_image"
  containers=("${containers[@]/$ctr/}")
  step "CUDA file images took $((SECONDS - t)) s"
}
[ "$need_cuda" = 0 ] || make_cuda_images

# ---- 3. the Dockerfiles ----------------------------------------------------------------------
# context_hash: what `COPY . /src` copies (.dockerignore: build/, build-*/, .git/ stay out).
context_hash() {
  (cd "$PD_ROOT" && find . \( -path ./.git -o -path ./build -o -path './build-*' \) -prune \
    -o -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) | sha
}

bud() {  # bud NAME INPUTS --build-arg ...
  local name=$1 inputs=$2
  shift 2
  local image=${image_of[$name]} file=${dockerfile_of[$name]}
  local key
  key=$(printf '%s\n' "$inputs" "$@" | sha)
  local forced=0
  if [ "$force" = 1 ] && [ -n "${want[$name]:-}" ]; then forced=1; fi
  if [ "$forced" = 0 ] && image_exists "$image" && [ "$(image_label "$image" io.pdserve.inputs)" = "$key" ]; then
    step "$image is up to date (inputs $key)"
    return
  fi
  local old before vol=() t=$SECONDS
  old=$(image_id "$image" || true)
  before=$(buildah containers -q 2>/dev/null | sort)
  if [ "$use_ccache" = 1 ] && [ "$name" != build ]; then
    vol=(--volume "$cache/ccache:/ccache")
  fi
  step "buildah bud $file -> $image (inputs $key)"
  bounded buildah bud --isolation chroot --pull=never --label "io.pdserve.inputs=$key" \
    "${vol[@]}" --build-arg "CMAKE_BUILD_PARALLEL_LEVEL=$jobs" "$@" \
    -f "$PD_ROOT/$file" -t "$image" "$PD_ROOT" ||
    die "buildah bud $file failed (its output is above)"
  # buildah 1.28 keeps (mounted) the container of a stage that is only a FROM used by COPY
  # --from (the "cuda" stages), even after a successful build: remove what this bud left.
  local c
  for c in $(comm -13 <(echo "$before") <(buildah containers -q 2>/dev/null | sort)); do
    buildah rm "$c" >/dev/null 2>&1 || true
  done
  step "$image built in $((SECONDS - t)) s"
  # The previous image under this tag is now unnamed: drop it (unless a container uses it).
  if [ -n "$old" ] && [ "$old" != "$(image_id "$image")" ]; then
    buildah rmi "$old" >/dev/null 2>&1 || true
  fi
}

if [ -n "$prebuilt" ]; then
  # The build stage's image: the base with the five binaries under /src/build and the marker
  # that makes runtime-cpu.Dockerfile skip its compile (a registry build image never has it).
  key=$( (cd "$prebuilt" && sha256sum "${PREBUILT_BINS[@]}"; image_id "$base_image") | sha)
  prebuilt_image="$LOCAL_REPO/prebuilt-cpu:$key"
  if image_exists "$prebuilt_image"; then
    step "binaries of $prebuilt: $prebuilt_image (cached)"
  else
    step "binaries of $prebuilt -> $prebuilt_image"
    ctr=$(buildah from --pull=never --quiet "$base_image")
    containers+=("$ctr")
    mnt=$(buildah mount "$ctr")
    for b in "${PREBUILT_BINS[@]}"; do
      mkdir -p "$mnt/src/build/$(dirname "$b")"
      cp "$prebuilt/$b" "$mnt/src/build/$b"
    done
    echo "compiled outside the image in $prebuilt (scripts/images.sh --prebuilt)" > "$mnt/src/build/PREBUILT"
    buildah umount "$ctr" >/dev/null
    bounded buildah commit --quiet --rm "$ctr" "$prebuilt_image" >/dev/null || die "buildah commit $prebuilt_image"
    containers=("${containers[@]/$ctr/}")
  fi
  bud runtime-cpu "prebuilt $(context_hash)$(image_id "$prebuilt_image")$(image_id "$base_image")" \
    --build-arg "BUILD_IMAGE=$prebuilt_image" --build-arg "DEBIAN_IMAGE=$base_image"
  drop_stale "$LOCAL_REPO/debian" "$base_image"
  drop_stale "$LOCAL_REPO/prebuilt-cpu" "$prebuilt_image"
  step "done: ${image_of[runtime-cpu]} (buildah images)"
  exit 0
fi

build_image=${image_of[build]}
bud build "$(cat "$PD_ROOT/deploy/docker/build.Dockerfile" "$PD_ROOT/scripts/setup.sh" \
  "$PD_ROOT/.dockerignore")$(image_id "$base_image")$(image_id "$cuda_devel_image")" \
  --build-arg "DEBIAN_IMAGE=$base_image" --build-arg "CUDA_DEVEL_IMAGE=$cuda_devel_image"

runtime_inputs="$(context_hash)$(image_id "$build_image")$(image_id "$base_image")"
if [ -n "${want[runtime-cpu]:-}" ]; then
  bud runtime-cpu "$runtime_inputs" \
    --build-arg "BUILD_IMAGE=$build_image" --build-arg "DEBIAN_IMAGE=$base_image"
fi
if [ -n "${want[runtime-cuda]:-}" ]; then
  bud runtime-cuda "$runtime_inputs$(image_id "$cuda_runtime_image")" \
    --build-arg "BUILD_IMAGE=$build_image" --build-arg "DEBIAN_IMAGE=$base_image" \
    --build-arg "CUDA_RUNTIME_IMAGE=$cuda_runtime_image"
fi

drop_stale "$LOCAL_REPO/debian" "$base_image"
[ -z "$cuda_devel_image" ] || drop_stale "$LOCAL_REPO/cuda-files" "$cuda_devel_image" "$cuda_runtime_image"
step "done; the images (buildah images):"
buildah images --format '{{.Name}}:{{.Tag}} {{.Size}}' |
  grep -E "^(localhost/)?(pdserve/|${LOCAL_REPO#localhost/}/|$LOCAL_REPO/)" | sed 's/^/[images]   /' >&2
