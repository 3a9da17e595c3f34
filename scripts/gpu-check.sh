#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: configure with the CUDA backend, build,
# run the gpu-labelled tests, print the GPU, and run the engine benchmark on
# the CUDA device when tandem-bench supports --device. Prints only what the
# commands themselves report.
#
# Usage: scripts/gpu-check.sh [build-dir]   (default: build-gpu)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-${root}/build-gpu}"
jobs="$(nproc 2>/dev/null || echo 2)"

if command -v nvidia-smi >/dev/null 2>&1; then
  echo "== GPU"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
else
  echo "== GPU: nvidia-smi not found; the gpu tests will skip without a device"
fi

echo "== configure (${build})"
cmake -S "${root}" -B "${build}" -DTANDEM_CUDA=ON -DCMAKE_BUILD_TYPE=Release

echo "== build"
cmake --build "${build}" -j"${jobs}" --target gpu_cuda_kernels_test tandem-bench

echo "== ctest -L gpu"
ctest --test-dir "${build}" -L gpu --output-on-failure

bench="${build}/bin/tandem-bench"
bench_help="$("${bench}" engine --help 2>&1 || true)"
if [[ -x "${bench}" && "${bench_help}" == *--device* ]]; then
  echo "== tandem-bench engine --device cuda"
  "${bench}" engine --device cuda
else
  echo "== tandem-bench engine has no --device flag in this build: CUDA benchmark not run"
fi
