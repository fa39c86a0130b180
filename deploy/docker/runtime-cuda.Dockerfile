# pdserve runtime image, CUDA backend: the CPU image's Debian 12 userland plus the CUDA runtime,
# cuBLAS and NCCL libraries from NVIDIA's pinned runtime image; the GPU driver (libcuda) comes from the
# node through the NVIDIA container toolkit.
#
#   docker build -f deploy/docker/runtime-cuda.Dockerfile -t pdserve/pdserve-cuda:0.1.0 .
ARG BUILD_IMAGE=pdserve/pdserve-build:0.1.0
ARG DEBIAN_IMAGE=debian:bookworm-20251229-slim
ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:13.0.2-runtime-ubuntu24.04

FROM ${BUILD_IMAGE} AS build
COPY . /src
# Only for local builds (scripts/images.sh): a compiler cache mounted at /ccache (buildah bud
# --volume) and the compile parallelism; a plain docker build has neither and compiles afresh.
ARG CMAKE_BUILD_PARALLEL_LEVEL
RUN if [ -d /ccache ]; then export CCACHE_DIR=/ccache CCACHE_BASEDIR=/src CCACHE_NOHASHDIR=1; fi \
 && cmake -S /src -B /src/build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DPD_ENABLE_CUDA=ON -DPD_ENABLE_NCCL=ON \
      -DPD_BUILD_TESTS=OFF \
 && cmake --build /src/build --target pd-router pd-worker pd-tierd pd-client pd-loadtest

FROM ${CUDA_RUNTIME_IMAGE} AS cuda

FROM ${DEBIAN_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libabsl20220623 libgrpc++1.51 libgrpc29 libprotobuf32 libgoogle-glog0v6 \
      libucx0 libhiredis0.14 libopenblas0-pthread libxxhash0 liburing2 libpcre2-8-0 \
      libcpp-httplib0.11 libssl3 libicu72 libstdc++6 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=cuda /usr/local/cuda-13.0/targets/x86_64-linux/lib/libcudart.so.13* /usr/local/lib/pdserve-cuda/
COPY --from=cuda /usr/local/cuda-13.0/targets/x86_64-linux/lib/libcublas.so.13* /usr/local/lib/pdserve-cuda/
COPY --from=cuda /usr/local/cuda-13.0/targets/x86_64-linux/lib/libcublasLt.so.13* /usr/local/lib/pdserve-cuda/
COPY --from=cuda /usr/lib/x86_64-linux-gnu/libnccl.so.2* /usr/local/lib/pdserve-cuda/
RUN echo /usr/local/lib/pdserve-cuda > /etc/ld.so.conf.d/pdserve-cuda.conf && ldconfig
COPY --from=build /src/build/services/router/pd-router /src/build/services/worker/pd-worker /src/build/services/tierd/pd-tierd /src/build/services/client/pd-client /src/build/loadtest/pd-loadtest /usr/local/bin/
ENV NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 65532:65532
ENTRYPOINT []
CMD ["/usr/local/bin/pd-router", "--help"]
