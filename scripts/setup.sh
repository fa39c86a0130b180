#!/usr/bin/env bash
# The one set-up path behind scripts/run.sh and scripts/test.sh: installs the Debian packages the
# build needs when they are missing, then configures and builds with CMake.
#
# Environment (all optional):
#   PD_BUILD_DIR   build directory (default: build)
#   PD_BUILD_TYPE  CMake build type (default: RelWithDebInfo)
#   PD_CMAKE_ARGS  extra CMake arguments, e.g. "-DPD_ENABLE_CUDA=OFF"
#   CI             when "true": warnings are errors and configure fails if UCX, hiredis, CUDA or
#                  NCCL came out OFF (PD_REQUIRE_ALL), so a missing install step cannot pass.
# Usage: source it (scripts do) or run it directly to just set up and build.
set -euo pipefail

PD_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PD_BUILD_DIR="${PD_BUILD_DIR:-${PD_ROOT}/build}"
PD_BUILD_TYPE="${PD_BUILD_TYPE:-RelWithDebInfo}"

# Build and test dependencies (Debian 12 package names). Keep in sync with deploy/docker.
PD_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libucx-dev ucx-utils
  libhiredis-dev redis-server redis-tools
  libabsl-dev libgoogle-glog-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev nlohmann-json3-dev libxxhash-dev liburing-dev libpcre2-dev libcpp-httplib-dev
  libicu-dev                     # ICU: UTF-8 macros (common/utf8), NFC (HF tokenizers)
  iproute2 procps curl fio python3 python3-jinja2  # jinja2: engine/chat differential test
  python3-jsonschema             # structured output e2e: answers validated against their schema
  libssl-dev openssl             # SHA-256/CRYPTO_memcmp for auth; openssl CLI makes test certs
  gnuplot-nox                    # pd-loadtest plots (optional at run time)
  clang libclang-rt-14-dev       # libFuzzer targets (tests/fuzz, the slow fuzz_libfuzzer test)
  python3-torch python3-numpy    # the PyTorch oracle (tests/reference), only under /usr/bin/python3
  golang-go golang-github-masterminds-sprig-dev golang-gopkg-yaml.v3-dev
    golang-github-xeipuuv-gojsonschema-dev  # tests/deploy chart check (Go, offline)
  debootstrap buildah            # scripts/images.sh and the slow deploy_image_runtime test
)

pd_log() { printf '[pdserve] %s\n' "$*" >&2; }

pd_install_packages() {
  local missing=()
  local pkg
  for pkg in "${PD_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$pkg")
    fi
  done
  if [ "${#missing[@]}" -eq 0 ]; then
    pd_log "all ${#PD_PACKAGES[@]} Debian packages present"
    return 0
  fi
  pd_log "installing ${#missing[@]} missing Debian packages: ${missing[*]}"
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null; then
      pd_log "error: need root or sudo to install: ${missing[*]}"
      return 1
    fi
    sudo=(sudo)
  fi
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}

# The official `openai` npm package for the OpenAI API e2e test (tests/e2e/openai, pinned by its
# package-lock.json). Node.js comes with this machine kind; Debian's nodejs + npm otherwise.
pd_install_npm() {
  local dir="$PD_ROOT/tests/e2e/openai"
  if ! command -v npm >/dev/null; then
    pd_log "installing Debian's nodejs and npm"
    local sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
      nodejs npm >/dev/null
  fi
  # npm ci again only when the lockfile changed since the last install (a copy is the stamp).
  if ! cmp -s "$dir/package-lock.json" "$dir/node_modules/.pd-installed-lock" 2>/dev/null; then
    pd_log "installing the npm packages of tests/e2e/openai (npm ci)"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null &&
      cp package-lock.json node_modules/.pd-installed-lock)
  fi
}

# ccache: key objects by paths relative to the checkout, so clones in other directories (CI's)
# reuse this machine's cache.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PD_ROOT}"
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"

pd_configure_and_build() {
  local args=(-S "$PD_ROOT" -B "$PD_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="$PD_BUILD_TYPE")
  if [ "${CI:-}" = "true" ]; then
    args+=(-DPD_REQUIRE_ALL=ON -DPD_WERROR=ON)
  fi
  # nvcc lives under /usr/local/cuda (not on PATH by default); AUTO picks it up from there.
  if [ -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then
    args+=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
  fi
  # shellcheck disable=SC2206
  args+=(${PD_CMAKE_ARGS:-})
  pd_log "configuring in $PD_BUILD_DIR"
  cmake "${args[@]}"
  pd_log "building ($(nproc) jobs)"
  local start=$SECONDS
  cmake --build "$PD_BUILD_DIR" -j "$(nproc)"
  pd_log "build took $((SECONDS - start)) s"
  if command -v ccache >/dev/null; then
    ccache --show-stats 2>/dev/null | grep -iE "hits|misses" | head -3 | sed 's/^/[pdserve] ccache: /' >&2 || true
  fi
}

pd_setup() {
  pd_install_packages
  pd_install_npm
  pd_configure_and_build
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  pd_setup
fi
