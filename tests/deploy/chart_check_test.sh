#!/usr/bin/env bash
# ctest deploy_chart_check: builds tests/deploy/chartcheck (Go, Debian's GOPATH sources, offline)
# and runs it: the Dockerfiles, the Grafana dashboard, the Helm chart rendered with each values
# file (ci/secure, ci/dev-insecure, ci/cpu, ci/gpu, ci/external-redis, ci/minimal) against the
# binaries' real --help and against the images scripts/images.sh builds (`--list`: repository and
# tag must match), twice (renders must be equal), with the hardening checks (pod security,
# NetworkPolicies) and, for the secure files, every secure-mode flag and its Secret mount; the
# defaults alone must refuse to render until the Secrets are named; every broken input under
# testdata/ must fail with its expected message.
#
# usage: chart_check_test.sh --source-dir DIR --build-dir DIR --bin NAME=PATH...
set -uo pipefail

src="" build="" bins=()
while [ $# -gt 0 ]; do
  case "$1" in
    --source-dir) src=$2; shift 2 ;;
    --build-dir) build=$2; shift 2 ;;
    --bin) bins+=(--bin "$2"); shift 2 ;;
    *) echo "chart_check_test.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$src" ] && [ -n "$build" ] || { echo "usage: $0 --source-dir DIR --build-dir DIR --bin NAME=PATH..." >&2; exit 2; }

out="$build/chartcheck"
mkdir -p "$out"
if ! command -v go >/dev/null; then
  echo "FAIL: go not found: scripts/setup.sh installs golang-go (PD_PACKAGES)"
  exit 1
fi
# GOPATH mode over Debian's packaged sources (golang-github-masterminds-sprig-dev,
# golang-gopkg-yaml.v3-dev): no module proxy, no network.
if ! (cd "$src/tests/deploy/chartcheck" &&
      env GO111MODULE=off GOPATH=/usr/share/gocode GOFLAGS= GOPROXY=off GOENV=off GOCACHE="$out/gocache" \
        go build -o "$out/chartcheck" .) > "$out/go-build.log" 2>&1; then
  echo "FAIL: building chartcheck:"
  cat "$out/go-build.log"
  exit 1
fi
cc="$out/chartcheck"
chart="$src/helm/pdserve"

# Every image the chart names is one scripts/images.sh builds, except the bundled Redis, which the
# chart takes from Docker Hub's official redis image (images.sh does not rebuild third-party images).
if ! bash "$src/scripts/images.sh" --list > "$out/images.list" 2> "$out/images.err"; then
  echo "FAIL: scripts/images.sh --list:"
  cat "$out/images.err"
  exit 1
fi
images=(--images "$out/images.list" --external-image redis)
# The Secrets the secure values name: the operator creates them (docs/deploy.md, "Secure mode").
secrets=()
for sec in pdserve-tls pdserve-cluster-token pdserve-api-keys pdserve-redis; do
  secrets+=(--assume-exists "Secret/$sec")
done

# Strictness follows the source tree: until pd-worker defines --tierd_address, the chart's use
# of it is allowed and printed as PENDING; once it does, an unknown flag fails as any other.
strict=()
if ! grep -Eq 'ABSL_FLAG\([^,]+, *tierd_address' "$src/services/worker/main.cc"; then
  strict+=(--pending-flag pd-worker:tierd_address)
  echo "NOTE: services/worker/main.cc has no --tierd_address yet: the chart's --tierd_address is NOT checked against pd-worker --help (PENDING lines below)"
fi
if [ ! -f "$src/services/tierd/main.cc" ]; then
  strict+=(--allow-missing-bin pd-tierd)
  echo "NOTE: services/tierd/main.cc does not exist: pd-tierd's flags are NOT checked"
fi

passed=0 failed=0
run_case() {  # run_case NAME EXPECT(ok|"substring") CMD...
  local name=$1 expect=$2
  shift 2
  local log="$out/$name.log" rc
  "$@" > "$log" 2>&1
  rc=$?
  if [ "$expect" = ok ]; then
    if [ $rc -eq 0 ]; then
      passed=$((passed + 1)); echo "PASS $name"; sed 's/^/    /' "$log"
      return
    fi
    failed=$((failed + 1)); echo "FAIL $name (exit $rc, want 0):"; sed 's/^/    /' "$log"
    return
  fi
  if [ $rc -eq 1 ] && grep -qF -- "$expect" "$log"; then
    passed=$((passed + 1)); echo "PASS $name (rejected: $(grep -F -m1 -- "$expect" "$log" | cut -c1-200))"
    return
  fi
  failed=$((failed + 1))
  echo "FAIL $name (exit $rc): want exit 1 and the message: $expect"
  sed 's/^/    /' "$log"
}

run_case docker ok "$cc" docker --dir "$src/deploy/docker" --setup "$src/scripts/setup.sh" --build-dir "$build"
run_case dashboard ok "$cc" dashboard --file "$chart/dashboards/pdserve.json" --src "$src/services"
run_case values-doc ok "$cc" values-doc --values "$chart/values.yaml" --doc "$src/docs/deploy.md"
# Secure by default: values.yaml alone does not render until the Secrets are named.
run_case chart-default-needs-secrets \
  'security.enabled is true: security.tls.existingSecret must name the Secret' \
  "$cc" chart --chart "$chart" "${bins[@]}" "${strict[@]}" "${images[@]}" "${secrets[@]}"
for v in secure cpu gpu external-redis; do
  run_case "chart-$v" ok "$cc" chart --chart "$chart" --values "$chart/ci/$v-values.yaml" \
    --expect-secure "${bins[@]}" "${strict[@]}" "${images[@]}" "${secrets[@]}" --out "$out/$v.yaml"
done
for v in dev-insecure minimal; do
  run_case "chart-$v" ok "$cc" chart --chart "$chart" --values "$chart/ci/$v-values.yaml" \
    "${bins[@]}" "${strict[@]}" "${images[@]}" "${secrets[@]}" --out "$out/$v.yaml"
done
# The development values are not secure: --expect-secure must notice (the check can fail).
run_case chart-dev-insecure-not-secure 'secure mode: --tls_cert is missing' \
  "$cc" chart --chart "$chart" --values "$chart/ci/dev-insecure-values.yaml" --expect-secure \
  "${bins[@]}" "${strict[@]}" "${images[@]}" "${secrets[@]}"

# Every broken values file (over the secure values) fails with the message its "# expect:" line
# names.
for f in "$src"/tests/deploy/testdata/broken-*.yaml; do
  expect=$(sed -n 's/^# expect: //p' "$f" | head -1)
  [ -n "$expect" ] || { failed=$((failed + 1)); echo "FAIL $f has no '# expect:' line"; continue; }
  run_case "$(basename "$f" .yaml)" "$expect" "$cc" chart --chart "$chart" \
    --values "$chart/ci/secure-values.yaml" --values "$f" --expect-secure \
    "${bins[@]}" "${strict[@]}" "${images[@]}" "${secrets[@]}"
done
run_case docker-bad-base 'FROM debian:bookworm-slim: tag "bookworm-slim" floats' \
  "$cc" docker --dir "$src/tests/deploy/testdata/docker-bad" --setup "$src/scripts/setup.sh" --build-dir "$build"
run_case docker-bad-latest 'tag "latest" is not a pinned version' \
  "$cc" docker --dir "$src/tests/deploy/testdata/docker-bad" --setup "$src/scripts/setup.sh" --build-dir "$build"
run_case docker-bad-apt 'installs [vim] with apt-get outside scripts/setup.sh' \
  "$cc" docker --dir "$src/tests/deploy/testdata/docker-bad" --setup "$src/scripts/setup.sh" --build-dir "$build"
run_case docker-bad-binary 'copies /src/build/services/gateway/pd-gateway, which the build does not produce' \
  "$cc" docker --dir "$src/tests/deploy/testdata/docker-bad" --setup "$src/scripts/setup.sh" --build-dir "$build"
run_case docker-bad-library 'needs libgrpc++.so.1.51 from Debian package libgrpc++1.51' \
  "$cc" docker --dir "$src/tests/deploy/testdata/docker-bad" --setup "$src/scripts/setup.sh" --build-dir "$build"
run_case docker-bad-package 'apt-get install libnot-a-package0: not a package' \
  "$cc" docker --dir "$src/tests/deploy/testdata/docker-bad" --setup "$src/scripts/setup.sh" --build-dir "$build"
run_case dashboard-bad 'metric pd_router_no_such_metric_total is not registered' \
  "$cc" dashboard --file "$src/tests/deploy/testdata/bad-dashboard.json" --src "$src/services"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
