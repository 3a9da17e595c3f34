# tandem-agent for GPU nodes, built with nothing from a registry (`make
# images`, docs/images.md): the local Debian 12 base, the agent compiled
# with CUDA against a toolkit the build mounts read-only at /usr/local/cuda,
# the CUDA runtime linked statically (so the node's driver, which the NVIDIA
# container toolkit mounts, is all it needs), and Debian's UCX: no CUDA
# transports, so KV moves through the agents' host staging buffer
# (kv_buffer staging). docker/agent.Dockerfile is the recipe with NVIDIA's
# CUDA images and UCX built with CUDA (GPUDirect RDMA, CUDA IPC/NVLink).
#
#   podman build --volume /usr/local/cuda:/usr/local/cuda:ro \
#     -f docker/agent-gpu-local.Dockerfile -t ghcr.io/tandem/agent:0.1.0-gpu-local .
#
# The final stage is the CPU image's: the binary loads the same libraries
# (libcuda is opened at run time, from the driver).

ARG DEBIAN_IMAGE=debian:12.11-slim

FROM ${DEBIAN_IMAGE} AS build
ARG BUILD_JOBS=
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
         build-essential cmake pkg-config \
         libucx-dev libcpp-httplib-dev libyaml-cpp-dev prometheus-cpp-dev libboost-dev \
         nlohmann-json3-dev libgtest-dev libpcre2-dev libxxhash-dev libcli11-dev \
         libssl-dev libutf8proc-dev ccache \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Only what CMake reads for the programs: the root CMakeLists.txt configures
# every folder below (the tests are off, so an edit there rebuilds nothing).
COPY CMakeLists.txt ./
COPY common common
COPY kernels kernels
COPY agent agent
COPY operator operator
COPY tools tools
COPY profiles profiles
# The same build stage, word for word, in agent-cpu.Dockerfile,
# operator.Dockerfile and agent-gpu-local.Dockerfile: a builder with layer
# caching (podman, buildah, docker) compiles the three programs once for the
# three images (the GPU agent's stage only adds the CUDA backend to it).
# CUDA off, whatever the builder mounts: the stage is the same everywhere.
# A builder may lend it a compiler cache, read-only, at /ccache (`podman build
# --volume DIR:/ccache:ro`; scripts/images.sh --ccache lends the host build's):
# what it holds for these sources and this compiler is taken from it, nothing
# is written to it. Without one (docker cannot mount in a build) all compiles.
# A mount, not a folder: a builder may leave the empty mount point in a layer.
RUN if mountpoint -q /ccache; then set -- -DTANDEM_CCACHE=ON -DTANDEM_CCACHE_DIR=/ccache; \
      export CCACHE_READONLY=1 CCACHE_TEMPDIR=/tmp/ccache; else set -- -DTANDEM_CCACHE=OFF; fi \
    && cmake -S /src -B /src/build -DCMAKE_BUILD_TYPE=Release -DTANDEM_TESTS=OFF -DTANDEM_CUDA=OFF "$@" \
    && cmake --build /src/build -j"${BUILD_JOBS:-$(nproc)}" \
         --target tandem-agent tandem-model tandem-operator \
    && strip --strip-unneeded /src/build/bin/tandem-agent /src/build/bin/tandem-model \
         /src/build/bin/tandem-operator

# The CPU build above, turned into a CUDA build: only the CUDA backend and
# the file that registers it compile (kernels/CMakeLists.txt); the rest is
# relinked.
FROM build AS build-cuda
ARG BUILD_JOBS=
# CUDA_ARCHITECTURES: the GPU generations the kernels are compiled for
# (sm_80 A100, sm_90 H100/H200).
ARG CUDA_ARCHITECTURES=80;90
RUN test -x /usr/local/cuda/bin/nvcc \
      || { echo "no CUDA toolkit at /usr/local/cuda: build with" \
                "--volume /usr/local/cuda:/usr/local/cuda:ro" >&2; exit 1; } \
    && if mountpoint -q /ccache; then set -- -DTANDEM_CCACHE=ON -DTANDEM_CCACHE_DIR=/ccache; \
         export CCACHE_READONLY=1 CCACHE_TEMPDIR=/tmp/ccache; else set -- -DTANDEM_CCACHE=OFF; fi \
    && cmake -S /src -B /src/build -DTANDEM_CUDA=ON "$@" \
         -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc \
         -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}" \
    && cmake --build /src/build -j"${BUILD_JOBS:-$(nproc)}" --target tandem-agent tandem-model \
    && strip --strip-unneeded /src/build/bin/tandem-agent /src/build/bin/tandem-model

FROM ${DEBIAN_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=https://github.com/tandem/tandem
ARG LICENSES=NOASSERTION
LABEL org.opencontainers.image.title="tandem-agent (GPU, Debian)" \
      org.opencontainers.image.description="Tandem serving agent (prefill/decode) for GPU nodes, CUDA runtime static, with Debian's UCX" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="${LICENSES}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
# One package per library the binaries and UCX's transport modules load
# (libuct opens /usr/lib/x86_64-linux-gnu/ucx/libuct_*.so at run time), and
# ca-certificates for `tandem-model fetch` over https (a pool's hf:// source).
# libc6, libstdc++6, libgcc-s1 and zlib1g are part of every Debian image.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
         libucx0 libnuma1 libibverbs1 ibverbs-providers librdmacm1 libnl-3-200 \
         libnl-route-3-200 libcpp-httplib0.11 libbrotli1 libssl3 libprometheus-cpp-core1.0 \
         libyaml-cpp0.7 libpcre2-8-0 libutf8proc2 libxxhash0 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 65532 tandem \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
         --shell /usr/sbin/nologin tandem
COPY --from=build-cuda /src/build/bin/tandem-agent /src/build/bin/tandem-model /usr/local/bin/
# What the NVIDIA container toolkit mounts into the container.
ENV NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 65532:65532
# The controller starts agent pods with command ["tandem-agent"] and the
# serve arguments (operator/controller/desired_objects.cpp).
ENTRYPOINT ["tandem-agent"]
