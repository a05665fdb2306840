# syntax=docker/dockerfile:1
# The coordinator (hyscaled) and the CLI (hyscale) on Debian 12. From the repository root:
#   docker build -f deploy/docker/coordinator.Dockerfile -t hyscale-coordinator .
# The build stage installs what scripts/install-deps.sh installs and builds with
# scripts/build.sh, as a developer machine and CI do; the runtime stage installs exactly the
# Debian packages owning the libraries the two binaries load (runtime-packages.sh).
# tests/deploy/check_containers.py keeps this file in step with those scripts and the CMake build.

FROM debian:12 AS build
COPY scripts/install-deps.sh /src/scripts/install-deps.sh
RUN apt-get update && /src/scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . /src
RUN HYSCALE_BUILD_DIR=/build /src/scripts/build.sh \
      -DHYSCALE_WITH_TORCH=OFF -DHYSCALE_BUILD_TESTS=OFF -DHYSCALE_CUDA=OFF && \
    mkdir -p /out && \
    /src/deploy/docker/runtime-packages.sh /build/server/hyscaled /build/client/hyscale \
      > /out/packages && \
    cp /build/server/hyscaled /build/client/hyscale /out/

FROM debian:12-slim AS runtime
COPY --from=build /out/packages /tmp/packages
# curl: the health check below.
RUN apt-get update && \
    apt-get install -y --no-install-recommends $(cat /tmp/packages) curl ca-certificates && \
    rm -rf /var/lib/apt/lists/* /tmp/packages && \
    groupadd --gid 10001 hyscale && \
    useradd --uid 10001 --gid hyscale --home-dir /var/lib/hyscale --create-home hyscale
COPY --from=build /out/hyscaled /out/hyscale /usr/local/bin/
USER 10001:10001
VOLUME /var/lib/hyscale
# gRPC, then /metrics and the web view.
EXPOSE 50051 9464
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
  CMD curl -fsS -o /dev/null http://127.0.0.1:9464/metrics || exit 1
ENTRYPOINT ["/usr/local/bin/hyscaled"]
CMD ["--listen=0.0.0.0:50051", "--metrics-listen=0.0.0.0:9464", "--data-dir=/var/lib/hyscale"]
