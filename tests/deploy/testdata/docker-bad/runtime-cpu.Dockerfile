# :latest, a binary the build does not make, and pd-tierd missing from /usr/local/bin.
FROM pdserve/pdserve-build:0.1.0 AS build
RUN cmake -S /src -B /src/build -DPD_ENABLE_CUDA=OFF && cmake --build /src/build --target pd-router pd-worker pd-gateway
FROM debian:latest
RUN apt-get update && apt-get install -y libabsl20220623 libnot-a-package0
COPY --from=build /src/build/services/router/pd-router /src/build/services/worker/pd-worker /src/build/services/gateway/pd-gateway /usr/local/bin/
