# Tandem — top-level commands. See README.md.
SHELL := /bin/bash
BUILD_DIR ?= build
ASAN_DIR ?= build-asan
JOBS ?= 2
MODEL_DIR ?= models/small
RUN_PORT ?= 8000
CMAKE_FLAGS ?=

DEB_PACKAGES := build-essential cmake pkg-config clang-format \
  libucx-dev ucx-utils libcpp-httplib-dev libyaml-cpp-dev prometheus-cpp-dev \
  libboost-dev nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev \
  libpcre2-dev libxxhash-dev libcli11-dev libssl-dev libutf8proc-dev prometheus xz-utils curl jq

SOURCES := $(shell git ls-files --cached --others --exclude-standard '*.h' '*.cpp' '*.cu' 2>/dev/null)

.PHONY: deps build test run format format-check asan tsan clean

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

$(BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: deps $(BUILD_DIR)/CMakeCache.txt
	cmake --build $(BUILD_DIR) -j$(JOBS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j$(JOBS) -LE 'gpu|bench'

# The local cluster of examples/cluster.yaml (its pools name models/small),
# one streamed request through its router, then serving until Ctrl-C.
run: build
	@[ -f $(MODEL_DIR)/config.json ] || $(BUILD_DIR)/bin/tandem-model --preset small --out $(MODEL_DIR)
	scripts/run-local.sh $(BUILD_DIR) examples/cluster.yaml $(RUN_PORT)

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

clean:
	rm -rf $(BUILD_DIR) $(ASAN_DIR) build-tsan
