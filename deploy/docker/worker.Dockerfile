# syntax=docker/dockerfile:1
# The worker agent (hyscale-worker) and the trainer (hyscale-train, with its CUDA kernels) on
# Debian 12, against PyTorch's libtorch for CUDA 13 (as scripts/build-with-pytorch.sh builds
# on GPU machines). From the repository root:
#   docker build -f deploy/docker/worker.Dockerfile -t hyscale-worker .
# The build stage installs what scripts/install-deps.sh installs, the CUDA 13 compiler from
# NVIDIA's Debian 12 repository and PyTorch's CUDA 13 wheel in a venv, then builds with
# scripts/build.sh. The runtime stage carries the venv (libtorch and the CUDA runtime libraries
# come with the wheel) and the Debian packages owning the other libraries the binaries load.
# The GPU driver and nvidia-smi come from the host through the NVIDIA container runtime.

ARG TORCH_VERSION=2.11.0
ARG CUDA_MAJOR_MINOR=13-0

FROM debian:12 AS build
ARG TORCH_VERSION
ARG CUDA_MAJOR_MINOR
COPY scripts/install-deps.sh /src/scripts/install-deps.sh
RUN apt-get update && /src/scripts/install-deps.sh && \
    apt-get install -y --no-install-recommends wget ca-certificates python3-venv && \
    wget -q https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb && \
    dpkg -i cuda-keyring_1.1-1_all.deb && rm cuda-keyring_1.1-1_all.deb && \
    apt-get update && \
    apt-get install -y --no-install-recommends cuda-nvcc-${CUDA_MAJOR_MINOR} \
      cuda-cudart-dev-${CUDA_MAJOR_MINOR} cuda-nvrtc-dev-${CUDA_MAJOR_MINOR} \
      libcublas-dev-${CUDA_MAJOR_MINOR} && \
    rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv && \
    /opt/venv/bin/pip install --no-cache-dir "torch==${TORCH_VERSION}" \
      --index-url https://download.pytorch.org/whl/cu130
COPY . /src
ENV TORCH_CUDA_ARCH_LIST=9.0a CUDACXX=/usr/local/cuda/bin/nvcc
RUN torch_prefix=$(/opt/venv/bin/python -c 'import torch; print(torch.utils.cmake_prefix_path)') && \
    HYSCALE_BUILD_DIR=/build /src/scripts/build.sh \
      -DCMAKE_PREFIX_PATH="$torch_prefix" -DHYSCALE_WITH_TORCH=ON -DHYSCALE_WITH_SERVICE=ON \
      -DHYSCALE_BUILD_TESTS=OFF -DHYSCALE_CUDA=ON && \
    mkdir -p /out/lib && \
    cp /build/worker/agent/hyscale-worker /build/worker/trainer/hyscale-train /out/ && \
    cp /build/kernels/torch/libhyscale_ops.so /out/lib/ && \
    HYSCALE_UNOWNED_OK=/opt/venv:/build /src/deploy/docker/runtime-packages.sh \
      /out/hyscale-worker /out/hyscale-train > /out/packages

FROM debian:12-slim AS runtime
COPY --from=build /out/packages /tmp/packages
RUN apt-get update && \
    apt-get install -y --no-install-recommends $(cat /tmp/packages) python3 && \
    rm -rf /var/lib/apt/lists/* /tmp/packages && \
    groupadd --gid 10001 hyscale && \
    useradd --uid 10001 --gid hyscale --home-dir /var/lib/hyscale-worker --create-home hyscale
# The same path as in the build stage, so libtorch's and the trainer's run paths hold.
COPY --from=build /opt/venv /opt/venv
COPY --from=build /out/hyscale-worker /out/hyscale-train /usr/local/bin/
COPY --from=build /out/lib/ /usr/local/lib/hyscale/
ENV LD_LIBRARY_PATH=/usr/local/lib/hyscale \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
WORKDIR /var/lib/hyscale-worker
# Healthy while the container sees its GPUs (the agent itself serves nothing to probe; the
# coordinator declares a silent agent lost).
HEALTHCHECK --interval=30s --timeout=10s --start-period=30s --retries=3 \
  CMD nvidia-smi -L >/dev/null || exit 1
ENTRYPOINT ["/usr/local/bin/hyscale-worker", "--trainer=/usr/local/bin/hyscale-train"]
