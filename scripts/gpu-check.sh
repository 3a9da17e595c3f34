#!/usr/bin/env bash
# One command on a machine with an NVIDIA GPU: print the GPU, build with the
# CUDA backend, run the gpu-labelled tests (CUDA kernels against the CPU's,
# the engine's exactness on CUDA, CUDA vs CPU greedy tokens, the P→D hand-off
# between two --device cuda agents), write two test models and run
# `tandem-bench engine --device cuda` on both: prefill tokens/s at a 2048-token
# prompt, decode tokens/s at batch 1 and 32, and the decode weight-streaming
# GB/s next to the device-to-device copy bandwidth measured in the same run.
# Prints only what the commands themselves report.
#
# Usage: scripts/gpu-check.sh [build-dir] [scratch-dir]
#   build-dir    default: build-gpu
#   scratch-dir  default: $TMPDIR or /tmp, a tandem-gpu-check-* folder in it.
#                Needs about 16.2 GB free: the llama3-8b-shaped model is
#                16.06 GB of bf16 weights, the small one 0.11 GB. Removed at
#                the end unless KEEP_MODELS=1.
# Environment: SKIP_8B=1 leaves the llama3-8b-shaped model out;
#              BENCH_JSON_DIR=DIR also writes each run's --json there.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-${root}/build-gpu}"
scratch_parent="${2:-${TMPDIR:-/tmp}}"
jobs="$(nproc 2>/dev/null || echo 2)"

echo "== GPU"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
else
  echo "nvidia-smi not found: the gpu tests will skip and the benchmark will refuse --device cuda"
fi

echo "== configure (${build})"
cmake -S "${root}" -B "${build}" -DTANDEM_CUDA=ON -DCMAKE_BUILD_TYPE=Release

echo "== build"
cmake --build "${build}" -j"${jobs}" --target gpu_cuda_kernels_test gpu_engine_exactness_test \
  tandem-agent tandem-bench tandem-model

echo "== ctest -L gpu"
ctest --test-dir "${build}" -L gpu --output-on-failure

mkdir -p "${scratch_parent}"
scratch="$(mktemp -d "${scratch_parent}/tandem-gpu-check-XXXXXX")"
if [[ "${KEEP_MODELS:-0}" != "1" ]]; then
  trap 'rm -rf "${scratch}"' EXIT
fi
echo "== models in ${scratch} ($(df -h --output=avail "${scratch}" | tail -1 | tr -d ' ') free)"
"${build}/bin/tandem-model" --preset small --out "${scratch}/small"
models=(small)
if [[ "${SKIP_8B:-0}" != "1" ]]; then
  "${build}/bin/tandem-model" --preset llama3-8b --out "${scratch}/llama3-8b"
  models+=(llama3-8b)
fi

bench="${build}/bin/tandem-bench"
if ! "${bench}" engine --help 2>&1 | grep -- "--batch" >/dev/null; then
  echo "== tandem-bench engine has no --batch flag in this build: batch-32 runs left out"
  batches=(1)
else
  batches=(1 32)
fi

# Prefill is measured at a 2048-token prompt with batch 1; batch 32 decodes
# after 512-token prompts each (32 prefills of 2048 tokens would dominate the
# run without changing what decode reads).
for model in "${models[@]}"; do
  # 2048-token prompts, or as long as the model's context leaves room for the
  # 64 decode steps (the small model's context is 2048).
  context=$(grep -o '"max_position_embeddings": *[0-9]*' "${scratch}/${model}/config.json" |
    grep -o '[0-9]*$')
  for batch in "${batches[@]}"; do
    prompt=$((context - 64 < 2048 ? context - 64 : 2048))
    [[ "${batch}" != "1" ]] && prompt=512
    args=(engine --device cuda --model "${scratch}/${model}" --prompt-tokens "${prompt}"
      --decode-tokens 64)
    [[ "${batch}" != "1" ]] && args+=(--batch "${batch}")
    if [[ -n "${BENCH_JSON_DIR:-}" ]]; then
      mkdir -p "${BENCH_JSON_DIR}"
      args+=(--json "${BENCH_JSON_DIR}/engine-${model}-batch${batch}.json")
    fi
    echo "== tandem-bench ${args[*]}"
    "${bench}" "${args[@]}"
  done
done
