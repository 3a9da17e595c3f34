# tandem-agent for GPU clusters: NVIDIA's CUDA images on Ubuntu 24.04, with
# UCX built from source with CUDA support (Ubuntu's and Debian's UCX have no
# CUDA transports), so KV blocks can move between GPUs over NVLink,
# InfiniBand/RoCE (GPUDirect RDMA) or TCP.
#
#   docker build -f docker/agent.Dockerfile -t ghcr.io/tandem/agent:0.1.0 \
#     --build-arg REVISION="$(git rev-parse HEAD)" .
#
# The final stage holds tandem-agent, tandem-model, UCX's libraries (copied
# from the build stage) and the runtime packages the binaries load;
# tests/integration/docker_images_test.cpp checks that list. docs/images.md
# describes the image and its build arguments.

ARG CUDA_VERSION=13.0.2
ARG UBUNTU_VERSION=24.04
# UCX release and the commit its tag names; the build stops when the fetched
# tag is not that commit.
ARG UCX_VERSION=1.22.0
ARG UCX_COMMIT=8a6b06fb880accbb933a79cda893883872c68d9d
ARG UCX_PREFIX=/opt/ucx

FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION} AS build
ARG UCX_VERSION
ARG UCX_COMMIT
ARG UCX_PREFIX
# Extra UCX configure flags, e.g. --with-nvcc-gencode="-gencode=arch=compute_90,code=sm_90"
# to build UCX's device code for one GPU generation only.
ARG UCX_CONFIGURE_FLAGS=
# Tandem's CUDA backend switch. The CMake project has no such option yet (the
# CUDA backend is later work); CMake ignores the variable until it does.
ARG TANDEM_CUDA=ON
ARG BUILD_JOBS=
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
         build-essential cmake pkg-config git ca-certificates autoconf automake libtool \
         libnuma-dev libibverbs-dev librdmacm-dev \
         libcpp-httplib-dev libyaml-cpp-dev prometheus-cpp-dev libboost-dev \
         nlohmann-json3-dev libgtest-dev libpcre2-dev libxxhash-dev libcli11-dev \
         libssl-dev libutf8proc-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /build/ucx
RUN git clone --depth 1 --branch "v${UCX_VERSION}" https://github.com/openucx/ucx.git . \
    && actual="$(git rev-parse HEAD)" \
    && if [ "${actual}" != "${UCX_COMMIT}" ]; then \
         echo "UCX v${UCX_VERSION} is commit ${actual}, expected ${UCX_COMMIT}" >&2; exit 1; \
       fi \
    && ./autogen.sh \
    && ./contrib/configure-release --prefix="${UCX_PREFIX}" --enable-mt --disable-static \
         --with-cuda=/usr/local/cuda --with-verbs --with-rdmacm --without-java --without-go \
         ${UCX_CONFIGURE_FLAGS} \
    && make -j"${BUILD_JOBS:-$(nproc)}" \
    && make install \
    && rm -rf /build/ucx

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
ENV PKG_CONFIG_PATH=${UCX_PREFIX}/lib/pkgconfig
RUN cmake -S /src -B /src/build -DCMAKE_BUILD_TYPE=Release -DTANDEM_TESTS=OFF \
         -DCMAKE_PREFIX_PATH="${UCX_PREFIX}" -DTANDEM_CUDA="${TANDEM_CUDA}" \
    && cmake --build /src/build -j"${BUILD_JOBS:-$(nproc)}" --target tandem-agent tandem-model \
    && strip --strip-unneeded /src/build/bin/tandem-agent /src/build/bin/tandem-model

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu${UBUNTU_VERSION}
ARG UCX_PREFIX
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=https://github.com/tandem/tandem
ARG LICENSES=NOASSERTION
LABEL org.opencontainers.image.title="tandem-agent" \
      org.opencontainers.image.description="Tandem serving agent (prefill/decode) for NVIDIA GPU nodes, with CUDA-enabled UCX" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="${LICENSES}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
# One package per library the binaries and UCX's transport modules load,
# Ubuntu 24.04's names (t64 suffixes, newer sonames). UCX itself is copied
# from the build stage; the CUDA runtime is the base image's, the driver
# libraries (libcuda, libnvidia-ml) come from the node through the NVIDIA
# container toolkit. libc6, libstdc++6, libgcc-s1 and zlib1g are part of
# every Ubuntu image.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
         libnuma1 libibverbs1 ibverbs-providers librdmacm1t64 libnl-3-200 libnl-route-3-200 \
         libcpp-httplib0.14t64 libbrotli1 libssl3t64 libprometheus-cpp-core1.0 \
         libyaml-cpp0.8 libpcre2-8-0 libutf8proc3 libxxhash0 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 65532 tandem \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
         --shell /usr/sbin/nologin tandem
COPY --from=build ${UCX_PREFIX}/lib ${UCX_PREFIX}/lib
COPY --from=build ${UCX_PREFIX}/bin/ucx_info ${UCX_PREFIX}/bin/ucx_info
RUN echo "${UCX_PREFIX}/lib" > /etc/ld.so.conf.d/ucx.conf && ldconfig
COPY --from=build /src/build/bin/tandem-agent /src/build/bin/tandem-model /usr/local/bin/
USER 65532:65532
# The controller starts agent pods with command ["tandem-agent"] and the
# serve arguments (operator/controller/desired_objects.cpp).
ENTRYPOINT ["tandem-agent"]
