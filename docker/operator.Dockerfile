# tandem-operator: the Kubernetes controller (the Helm chart runs it with
# `args: [controller, ...]`) and the router (Router pods run it with
# command ["tandem-operator"] and `router ...` arguments).
#
#   docker build -f docker/operator.Dockerfile -t ghcr.io/tandem/operator:0.1.0 .
#
# Runs as uid 65532 on a read-only root filesystem: the operator writes no
# file (its state lives in the API server), and nothing in the image needs a
# writable path outside /tmp. docs/images.md describes the image.

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

FROM ${DEBIAN_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=https://github.com/tandem/tandem
ARG LICENSES=NOASSERTION
LABEL org.opencontainers.image.title="tandem-operator" \
      org.opencontainers.image.description="Tandem's Kubernetes controller and request router" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="${LICENSES}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
# One package per library tandem-operator loads. libc6, libstdc++6,
# libgcc-s1 and zlib1g are part of every Debian image. No ca-certificates: in
# a pod the API server's CA is the service account's ca.crt.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
         libcpp-httplib0.11 libbrotli1 libssl3 libprometheus-cpp-core1.0 libyaml-cpp0.7 \
         libpcre2-8-0 libutf8proc2 libxxhash0 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 65532 tandem \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
         --shell /usr/sbin/nologin tandem
COPY --from=build /src/build/bin/tandem-operator /usr/local/bin/
USER 65532:65532
# The chart gives only `args:` (controller ...), Router pods give
# command ["tandem-operator"] and `router ...`: both run this binary.
ENTRYPOINT ["tandem-operator"]
