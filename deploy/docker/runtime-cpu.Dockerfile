# pdserve runtime image, CPU backend: pd-router, pd-worker, pd-tierd (what the Helm chart runs)
# plus pd-client and pd-loadtest, on Debian 12 slim with only the shared libraries they load.
#
#   docker build -f deploy/docker/runtime-cpu.Dockerfile -t pdserve/pdserve-cpu:0.1.0 .
ARG BUILD_IMAGE=pdserve/pdserve-build:0.1.0
ARG DEBIAN_IMAGE=debian:bookworm-20251229-slim

FROM ${BUILD_IMAGE} AS build
COPY . /src
# Only for local builds (scripts/images.sh): a compiler cache mounted at /ccache (buildah bud
# --volume) and the compile parallelism; a plain docker build has neither and compiles afresh.
ARG CMAKE_BUILD_PARALLEL_LEVEL
# A BUILD_IMAGE that already holds the five binaries under /src/build with the marker
# /src/build/PREBUILT (scripts/images.sh --prebuilt: compiled CPU-only on a Debian 12 machine with
# the same packages; the image test uses it) skips the compile; the build image never has it.
RUN if [ -f /src/build/PREBUILT ]; then echo "prebuilt binaries: $(cat /src/build/PREBUILT)"; \
    else \
      if [ -d /ccache ]; then export CCACHE_DIR=/ccache CCACHE_BASEDIR=/src CCACHE_NOHASHDIR=1; fi \
      && cmake -S /src -B /src/build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
           -DPD_ENABLE_CUDA=OFF -DPD_BUILD_TESTS=OFF \
      && cmake --build /src/build --target pd-router pd-worker pd-tierd pd-client pd-loadtest ; \
    fi

FROM ${DEBIAN_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
# The Debian packages owning the libraries the binaries link (the chart check derives the list
# from the built binaries with readelf + dpkg -S and fails when one is missing here).
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libabsl20220623 libgrpc++1.51 libgrpc29 libprotobuf32 libgoogle-glog0v6 \
      libucx0 libhiredis0.14 libopenblas0-pthread libxxhash0 liburing2 libpcre2-8-0 \
      libcpp-httplib0.11 libssl3 libicu72 libstdc++6 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/build/services/router/pd-router /src/build/services/worker/pd-worker /src/build/services/tierd/pd-tierd /src/build/services/client/pd-client /src/build/loadtest/pd-loadtest /usr/local/bin/
# 65532: an unprivileged uid with no home; the chart mounts everything it writes.
USER 65532:65532
ENTRYPOINT []
CMD ["/usr/local/bin/pd-router", "--help"]
