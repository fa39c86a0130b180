# pdserve build image: Debian 12 with exactly the packages scripts/setup.sh installs (its own
# pd_install_packages reads PD_PACKAGES, so the two cannot drift) plus CUDA 13.0 and NCCL taken
# from NVIDIA's pinned devel image, laid out as on the development machines (/usr/local/cuda).
#
#   docker build -f deploy/docker/build.Dockerfile -t pdserve/pdserve-build:0.1.0 .
#
# The runtime images build pdserve inside this image (BUILD_IMAGE).
ARG DEBIAN_IMAGE=debian:bookworm-20251229-slim
ARG CUDA_DEVEL_IMAGE=nvidia/cuda:13.0.2-devel-ubuntu24.04

FROM ${CUDA_DEVEL_IMAGE} AS cuda

FROM ${DEBIAN_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
COPY scripts/setup.sh /opt/pdserve/scripts/setup.sh
RUN bash -c 'source /opt/pdserve/scripts/setup.sh && pd_install_packages' \
 && rm -rf /var/lib/apt/lists/*
# The CUDA toolkit is relocatable (NVIDIA builds it against an old glibc); NCCL comes from the
# same image's libnccl-dev and goes beside it, as on the machines CMake's NCCL lookup expects.
# (Destinations are the real directories: include/ and lib64/ are links to targets/.) The header
# glob: NCCL 2.28 ships nccl.h and nccl_device.h, older releases nccl.h and nccl_net.h.
COPY --from=cuda /usr/local/cuda-13.0 /usr/local/cuda-13.0
COPY --from=cuda /usr/include/nccl*.h /usr/local/cuda-13.0/targets/x86_64-linux/include/
COPY --from=cuda /usr/lib/x86_64-linux-gnu/libnccl.so.2* /usr/local/cuda-13.0/targets/x86_64-linux/lib/
RUN ln -s cuda-13.0 /usr/local/cuda \
 && ln -s libnccl.so.2 /usr/local/cuda-13.0/targets/x86_64-linux/lib/libnccl.so \
 && echo /usr/local/cuda-13.0/targets/x86_64-linux/lib > /etc/ld.so.conf.d/cuda.conf && ldconfig
ENV PATH=/usr/local/cuda/bin:${PATH}
WORKDIR /src
