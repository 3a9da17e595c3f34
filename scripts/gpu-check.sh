#!/usr/bin/env bash
# One command on a machine with an NVIDIA GPU: print the GPU, build with the
# CUDA backend, run the gpu-labelled tests (CUDA kernels against the CPU's,
# the engine's exactness on CUDA, CUDA vs CPU greedy tokens, the P→D hand-off
# between two --device cuda agents), write two test models and run
# `tandem-bench engine --device cuda` on both: prefill tokens/s at a 2048-token
# prompt, decode tokens/s at batch 1 and 32, and the decode weight-streaming
# GB/s next to the device-to-device copy bandwidth measured in the same run,
# then each backend call of one prefill and one decode timed alone
# (--profile-ops: which kernel the time goes to).
# Then, where python3 imports torch and transformers, the same models side by
# side with PyTorch (scripts/torch_compare.py). Prints only what the commands
# themselves report.
#
# Usage: scripts/gpu-check.sh [build-dir] [scratch-dir]
#   build-dir    default: build-gpu; with TANDEM_PREBUILT=1, a folder that
#                scripts/gpu-pack.sh filled on a machine with the compilers
#                (nothing is configured or built, the test binaries run
#                directly; docs/cuda.md#checking-on-a-gpu)
#   scratch-dir  default: $TMPDIR or /tmp, a tandem-gpu-check-* folder in it.
#                Needs about 16.2 GB free: the llama3-8b-shaped model is
#                16.06 GB of bf16 weights, the small one 0.11 GB. Removed at
#                the end unless KEEP_MODELS=1.
# Environment: SKIP_8B=1 leaves the llama3-8b-shaped model out, SKIP_SMALL=1
#              the small one (its benchmark runs and PyTorch comparison);
#              BENCH_JSON_DIR=DIR keeps each run's --json (and the PyTorch
#              comparison's JSON) there;
#              TORCH_COMPARE=0 leaves the PyTorch comparison out;
#              TORCH_PYTHON=python3 the interpreter that has torch;
#              BENCH_REPEATS=N runs per benchmark figure (default 3; the
#              best is reported): 1 or 2 fits the whole check into a
#              10-minute window with the llama3-8b-shaped model;
#              STEP_TIMEOUT=S stops any one test binary or benchmark run
#              after S seconds (default 300); WGMMA_TIMEOUT=S (default 60)
#              the wgmma step's two test binaries;
#              SANITIZE=1 also runs the fast kernels' tests under
#              compute-sanitizer memcheck, and the candidates' and the
#              wgmma configurations' row tests under racecheck and
#              synccheck (the GEMM rows at the emulator's shapes: the
#              tools run kernels far slower; SANITIZE_TIMEOUT=S, default
#              120, per run), a hazard failing them alone;
#              FAST=0 leaves out the second pass of the gpu tests and the
#              benchmark runs with --cuda-kernels fast (docs/cuda.md#kernel-sets);
#              FLASH=0 leaves out the flash attention kernel's checks and
#              benchmark runs (--cuda-kernels flash, the default on CUDA);
#              FUSED_FAST=1 adds the benchmark runs of the fast kernels
#              with --fuse-projections alone;
#              F32_BENCH=0 leaves out the benchmark runs with f32 compute
#              (--cuda-kernels reference, and fast without bf16 compute:
#              the slowest runs, their kernels unchanged since a figure of
#              theirs was taken), so a short window goes to the bf16 ones;
#              UNORDERED=0 leaves out the runs with --unordered-decode (the
#              cost of batch invariance, measured on the H200 of 2026-12-04);
#              PROFILE=1 ends with Nsight Compute's counters of the matmul
#              and attention kernels of a 2-layer llama3-8b-shaped model
#              (docs/cuda.md#kernel-profile), PROFILE_TIMEOUT=S (default
#              60) per ncu run, PROFILE_RUNS="batch1 batch32
#              batch1-candidates batch32-candidates" (the default) which;
#              CHECK_BUDGET=S the seconds the whole check may take (a GPU
#              window's limit less a margin): an ncu run that could end
#              past it is left out, so that the check ends on its own
#              summary instead of being stopped inside the profiler.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-${root}/build-gpu}"
scratch_parent="${2:-${TMPDIR:-/tmp}}"
jobs="$(nproc 2>/dev/null || echo 2)"
fast="${FAST:-1}"
fast_failed=0
flash="${FLASH:-${fast}}"
flash_failed=0
candidates_failed=0  # a candidate's kernel test or benchmark run failed (no serving path)
wgmma_failed=0
wgmma_stuck=0  # the wgmma step hung or crashed: its configurations are not timed
f32_bench="${F32_BENCH:-1}"
# gpu_engine_exactness_test's exactness checks: the gtest filter and the
# ctest regex that pick them.
exactness_filter='*CudaExactnessTest*:*CudaLongPrompt*'
exactness_regex='CudaExactnessTest|CudaLongPrompt'
# The serving flash configuration's flags, and the candidates' (the next
# defaults once a GPU has passed them): the benchmark runs and the profile.
serving_flags="--cuda-kernels flash --compute-dtype bf16 --fuse-projections"
candidate_flags="${serving_flags} --deep-skinny --compact-attention --deep-attention"

echo "== GPU"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
else
  echo "nvidia-smi not found: the gpu tests will skip and the benchmark will refuse --device cuda"
fi

prebuilt="${TANDEM_PREBUILT:-0}"
if [[ "${prebuilt}" == "1" ]]; then
  # Binaries packed by scripts/gpu-pack.sh on a machine with the compilers;
  # their libraries and UCX's modules travel beside them.
  echo "== prebuilt binaries in ${build}"
  export LD_LIBRARY_PATH="${build}/lib${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
  export UCX_MODULE_DIR="${build}/ucx"
else
  echo "== configure (${build})"
  cmake -S "${root}" -B "${build}" -DTANDEM_CUDA=ON -DCMAKE_BUILD_TYPE=Release

  echo "== build"
  cmake --build "${build}" -j"${jobs}" --target gpu_instructions_test gpu_cuda_kernels_test \
    gpu_engine_exactness_test engine_backend_exactness_test tandem-agent tandem-bench tandem-model
fi

# limited CMD...: CMD, stopped after STEP_TIMEOUT seconds (default 300), so a
# kernel that hangs costs one step of a short GPU window, not all of it;
# then the step's seconds and the check's so far, on the script's own
# output (fd 3) wherever CMD's goes: what the next window is sized by.
exec 3>&1
limited() {
  local start="${SECONDS}" status=0
  timeout --kill-after=10 "${STEP_TIMEOUT:-300}" "$@" || status=$?
  echo "-- ${1##*/}: $((SECONDS - start)) s, exit ${status} (${SECONDS} s into the check)" >&3
  return "${status}"
}

# gpu_tests [gtest filter] [ctest -E regex]: the gpu-labelled tests, through
# ctest in a build directory, or the test binaries themselves when prebuilt.
gpu_tests() {
  if [[ "${prebuilt}" == "1" ]]; then
    local status=0
    for test in gpu_instructions_test gpu_cuda_kernels_test gpu_engine_exactness_test; do
      echo "-- ${test}"
      limited "${build}/tests/${test}" --gtest_filter="${1:-*}" --gtest_brief=1 || status=1
    done
    return "${status}"
  fi
  ctest --test-dir "${build}" -L gpu ${2:+-E "$2"} --output-on-failure
}

# Tensor-core instructions in the CUDA library's machine code (the fast
# kernels' bf16 GEMM is the one that should hold them): HMMA (mma.sync)
# and HGMMA (wgmma: bf16 GEMM configuration 4, sm_90a builds).
cuobjdump="$(command -v cuobjdump || true)"
[[ -z "${cuobjdump}" && -x /usr/local/cuda/bin/cuobjdump ]] && cuobjdump=/usr/local/cuda/bin/cuobjdump
cuda_library="${build}/kernels/libtandem_kernels_cuda.a"
[[ "${prebuilt}" == "1" ]] && cuda_library="${build}/bin/tandem-bench"
if [[ -n "${cuobjdump}" && -f "${cuda_library}" ]]; then
  sass="$("${cuobjdump}" --dump-sass "${cuda_library}")"
  echo "== HMMA in ${cuda_library}: $(grep -c HMMA <<<"${sass}" || true)"
  echo "== HGMMA in ${cuda_library}: $(grep -c HGMMA <<<"${sass}" || true)"
else
  echo "== cuobjdump or ${cuda_library} not found: HMMA and HGMMA counts left out"
fi

# The reference kernels first, without the fast kernels' own tests: a fault
# in the opt-in kernels must not stop the rest of the check.
# A failure is reported at the end; the figures still come (one GPU window).
echo "== gpu tests (reference kernels)"
reference_failed=0
gpu_tests '-CudaFastKernelsTest*:*Warpgroup*:*TensorCopy*' 'CudaFastKernelsTest|Warpgroup|TensorCopy' || reference_failed=1
if [[ "${fast}" == "1" ]]; then
  # Every gpu test, the exactness checks' CUDA backend built with the fast
  # kernels (TANDEM_CUDA_KERNELS), and the unit test's CUDA variants.
  echo "== gpu tests and engine_backend_exactness_test, TANDEM_CUDA_KERNELS=fast"
  TANDEM_CUDA_KERNELS=fast gpu_tests '-*FlashAttention*:*Warpgroup*:*Wgmma*:*TensorCopy*:*Candidate*' \
    'FlashAttention|Warpgroup|Wgmma|TensorCopy|Candidate' || fast_failed=1
  if [[ "${prebuilt}" == "1" ]]; then
    TANDEM_CUDA_KERNELS=fast limited "${build}/tests/engine_backend_exactness_test" \
      --gtest_brief=1 || fast_failed=1
  else
    TANDEM_CUDA_KERNELS=fast ctest --test-dir "${build}" -R '^engine_backend_exactness_test' \
      --output-on-failure || fast_failed=1
  fi
  # The engine's exactness checks (chunked, batched, prefix hit, recorded
  # steps) again with bf16 compute: each compares the backend with itself.
  echo "== gpu exactness tests, TANDEM_CUDA_KERNELS=fast TANDEM_CUDA_COMPUTE_DTYPE=bf16"
  if [[ "${prebuilt}" == "1" ]]; then
    TANDEM_CUDA_KERNELS=fast TANDEM_CUDA_COMPUTE_DTYPE=bf16 limited \
      "${build}/tests/gpu_engine_exactness_test" --gtest_filter="${exactness_filter}" \
      --gtest_brief=1 || fast_failed=1
  else
    TANDEM_CUDA_KERNELS=fast TANDEM_CUDA_COMPUTE_DTYPE=bf16 ctest --test-dir "${build}" \
      -R "${exactness_regex}" --output-on-failure || fast_failed=1
  fi
  # Fused launches (--fuse-projections: the GEMV's fold in its partial
  # kernel, x's bf16 fragments written by x's producer): the exactness
  # checks under f32 and bf16 compute; the kernel tests ran above.
  echo "== gpu exactness tests, TANDEM_CUDA_KERNELS=fast TANDEM_CUDA_FUSED_LAUNCHES=1"
  for compute in f32 bf16; do
    if [[ "${prebuilt}" == "1" ]]; then
      TANDEM_CUDA_KERNELS=fast TANDEM_CUDA_COMPUTE_DTYPE="${compute}" TANDEM_CUDA_FUSED_LAUNCHES=1 \
        limited "${build}/tests/gpu_engine_exactness_test" --gtest_filter="${exactness_filter}" \
        --gtest_brief=1 || fast_failed=1
    else
      TANDEM_CUDA_KERNELS=fast TANDEM_CUDA_COMPUTE_DTYPE="${compute}" TANDEM_CUDA_FUSED_LAUNCHES=1 \
        ctest --test-dir "${build}" -R "${exactness_regex}" --output-on-failure || fast_failed=1
    fi
  done
  # The wgmma twins of the bf16 GEMM (configurations 4 to 7, compute
  # capability 9.0 only): the instruction probes (descriptors and the
  # accumulator layout; tensor copies, their swizzle and barriers; a
  # failure is a fault of that code) and their rows
  # against configuration 0's (a difference says HGMMA rounds a k16 step
  # otherwise than HMMA). Reported apart: no serving path runs them.
  echo "== wgmma: the instruction probes, and bf16 GEMM configurations 4 to 7 against 0"
  if [[ "${prebuilt}" == "1" ]]; then
    # Seconds on a GPU; a barrier that never completes would hang, so the
    # step has a limit of its own, and a hang or a crash (stopped by the
    # limit or a signal) keeps the configurations out of the timing below,
    # which would meet it again.
    for test in gpu_instructions_test gpu_cuda_kernels_test; do
      status=0
      STEP_TIMEOUT="${WGMMA_TIMEOUT:-60}" limited "${build}/tests/${test}" \
        --gtest_filter='*Warpgroup*:*Wgmma*:*TensorCopy*' --gtest_brief=1 || status=$?
      if [[ "${status}" != "0" ]]; then
        wgmma_failed=1
        if ((status == 124 || status >= 128)); then wgmma_stuck=1; fi
      fi
    done
  else
    ctest --test-dir "${build}" -L gpu -R 'Warpgroup|Wgmma|TensorCopy' --output-on-failure || wgmma_failed=1
  fi
  # The flash attention kernel (--cuda-kernels flash): its kernel test
  # (near the reference, chunked = one-shot to the bit) and its place in the
  # model identity, then the engine's
  # exactness checks with it, f32 and bf16 compute (it runs where the KV
  # cache is bf16; elsewhere the grouped kernel does).
  if [[ "${flash}" == "1" ]]; then
    echo "== flash attention: its kernel test and the exactness checks, TANDEM_CUDA_KERNELS=flash"
    for test in gpu_cuda_kernels_test gpu_engine_exactness_test; do
      limited "${build}/tests/${test}" --gtest_filter='*FlashAttention*' --gtest_brief=1 ||
        flash_failed=1
    done
    for compute in f32 bf16; do
      TANDEM_CUDA_KERNELS=flash TANDEM_CUDA_COMPUTE_DTYPE="${compute}" limited \
        "${build}/tests/gpu_engine_exactness_test" --gtest_filter="${exactness_filter}" \
        --gtest_brief=1 || flash_failed=1
    done
  fi
  # The candidates for the next defaults (deep decode and attention loads,
  # the compact attention grid, and in the exactness checks the wide bf16
  # GEMM's configuration 9 for prefills past 256 rows: opt-in,
  # docs/cuda.md): their kernel tests,
  # then the engine's exactness checks with all of them on the flash kernels
  # under bf16 compute with fused launches (the candidates' benchmark run),
  # reported apart, so that a fault of theirs never counts against the
  # kernels that serve; their benchmark run below is left out if they fail.
  echo "== candidates: their kernel tests (deep decode and attention loads, compact attention grid)" \
    "and the exactness checks with them (and the wide bf16 GEMM, configuration 9)"
  if [[ "${prebuilt}" == "1" ]]; then
    limited "${build}/tests/gpu_cuda_kernels_test" --gtest_filter='*Candidate*' --gtest_brief=1 ||
      candidates_failed=1
    # engine_backend_exactness_test's CUDA checks include TestBackendTest,
    # which fails unless the backend names the candidates.
    for run in "gpu_engine_exactness_test ${exactness_filter}" \
      "engine_backend_exactness_test *cuda*"; do
      TANDEM_CUDA_KERNELS=flash TANDEM_CUDA_COMPUTE_DTYPE=bf16 TANDEM_CUDA_FUSED_LAUNCHES=1 \
        TANDEM_CUDA_CANDIDATES=1 limited "${build}/tests/${run%% *}" \
        --gtest_filter="${run#* }" --gtest_brief=1 || candidates_failed=1
    done
  else
    ctest --test-dir "${build}" -L gpu -R 'Candidate' --output-on-failure || candidates_failed=1
    TANDEM_CUDA_KERNELS=flash TANDEM_CUDA_COMPUTE_DTYPE=bf16 TANDEM_CUDA_FUSED_LAUNCHES=1 \
      TANDEM_CUDA_CANDIDATES=1 ctest --test-dir "${build}" \
      -R "${exactness_regex}|^engine_backend_exactness_test.*cuda" --output-on-failure ||
      candidates_failed=1
  fi
  # SANITIZE=1: the fast kernels' own tests under compute-sanitizer memcheck
  # (out-of-bounds and misaligned accesses; the tool runs on some GPU
  # machines only, docs/cuda.md).
  if [[ "${SANITIZE:-0}" == "1" ]]; then
    sanitizer="$(command -v compute-sanitizer || true)"
    [[ -z "${sanitizer}" && -x /usr/local/cuda/bin/compute-sanitizer ]] &&
      sanitizer=/usr/local/cuda/bin/compute-sanitizer
    if [[ -z "${sanitizer}" ]]; then
      echo "== compute-sanitizer not found: SANITIZE=1 left out"
    else
      echo "== compute-sanitizer memcheck: CudaFastKernelsTest"
      limited "${sanitizer}" --tool memcheck --error-exitcode 1 \
        "${build}/tests/gpu_cuda_kernels_test" --gtest_filter='CudaFastKernelsTest*:-*Candidate*' \
        --gtest_brief=1 || fast_failed=1
      # Shared-memory hazards (racecheck) and barrier misuse (synccheck)
      # in the kernels with asynchronous copies and mbarriers that no GPU
      # has passed yet: what the emulator, one fiber at a time, cannot show.
      # Each run is limited to SANITIZE_TIMEOUT seconds (default 120); the
      # wgmma rows are left out once the wgmma step hung, and a hang here
      # keeps configurations 4 to 7 out of the timing, as there.
      for tool in racecheck synccheck; do
        echo "== compute-sanitizer ${tool}: the candidates' kernel tests, the wgmma rows"
        TANDEM_GPU_TEST_SMALL_SHAPES=1 STEP_TIMEOUT="${SANITIZE_TIMEOUT:-120}" \
          limited "${sanitizer}" --tool "${tool}" --error-exitcode 1 \
          "${build}/tests/gpu_cuda_kernels_test" --gtest_filter='*Candidate*' --gtest_brief=1 ||
          candidates_failed=1
        if [[ "${wgmma_stuck}" == "1" ]]; then
          echo "== compute-sanitizer ${tool}: the wgmma rows left out (the wgmma step hung)"
          continue
        fi
        status=0
        TANDEM_GPU_TEST_SMALL_SHAPES=1 STEP_TIMEOUT="${SANITIZE_TIMEOUT:-120}" \
          limited "${sanitizer}" --tool "${tool}" --error-exitcode 1 \
          "${build}/tests/gpu_cuda_kernels_test" --gtest_filter='*Bf16WgmmaRows*' \
          --gtest_brief=1 || status=$?
        if [[ "${status}" != "0" ]]; then
          wgmma_failed=1
          if ((status == 124 || status >= 128)); then wgmma_stuck=1; fi
        fi
      done
    fi
  fi
fi

mkdir -p "${scratch_parent}"
scratch="$(mktemp -d "${scratch_parent}/tandem-gpu-check-XXXXXX")"
if [[ "${KEEP_MODELS:-0}" != "1" ]]; then
  trap 'rm -rf "${scratch}"' EXIT
fi
echo "== models in ${scratch} ($(df -h --output=avail "${scratch}" | tail -1 | tr -d ' ') free)"
models=()
if [[ "${SKIP_SMALL:-0}" != "1" ]]; then
  "${build}/bin/tandem-model" --preset small --out "${scratch}/small"
  models+=(small)
fi
if [[ "${SKIP_8B:-0}" != "1" ]]; then
  "${build}/bin/tandem-model" --preset llama3-8b --out "${scratch}/llama3-8b"
  models+=(llama3-8b)
fi

echo "-- models written (${SECONDS} s into the check)"

bench="${build}/bin/tandem-bench"
if ! "${bench}" engine --help 2>&1 | grep -- "--batch" >/dev/null; then
  echo "== tandem-bench engine has no --batch flag in this build: batch-32 runs left out"
  batches=(1)
else
  batches=(1 32)
fi

# Prefill is measured at a 2048-token prompt with batch 1; batch 32 decodes
# after 512-token prompts each (32 prefills of 2048 tokens would dominate the
# run without changing what decode reads). Each run's --json is written (the
# PyTorch comparison reads it), in the scratch folder unless BENCH_JSON_DIR.
json_dir="${BENCH_JSON_DIR:-${scratch}/bench-json}"
mkdir -p "${json_dir}"
# What an earlier run left there would be read as this run's (gpu_goals.py).
for model in "${models[@]}"; do
  rm -f "${json_dir}/engine-${model}-"*.json "${json_dir}/torch-${model}.json" \
    "${json_dir}/tandem-tokens-${model}.json"
done
# The fastest bf16 GEMM configuration of a run's --bf16-gemm-configs rows
# whose outputs equal configuration 0's; with a second argument, the fastest
# from that configuration on. Never one whose own checks failed above: the
# wgmma configurations (4 to 7) after a failed wgmma step, the wide ones (8
# and 9) after a failed candidates' step (its row test and exactness checks
# hold theirs). Nothing (the serving configuration) when no row qualifies
# or the file cannot be read.
fastest_gemm_config() {
  local failed=()
  [[ "${wgmma_failed}" != "0" ]] && failed+=(4 5 6 7)
  [[ "${candidates_failed}" != "0" ]] && failed+=(8 9)
  python3 - "$1" "${2:-0}" "${failed[*]:-}" <<'PY' 2>/dev/null || true
import json, sys
rows = json.load(open(sys.argv[1])).get("bf16_gemm_configs", [])
low = int(sys.argv[2])
failed = {int(c) for c in sys.argv[3].split()}
same = [r for r in rows if r.get("same_bits_as_config0") and "layer_ms" in r and r["config"] >= low
        and r["config"] not in failed]
print(min(same, key=lambda r: r["layer_ms"])["config"] if same else "")
PY
}
for model in "${models[@]}"; do
  gemm_config=""
  # 2048-token prompts, or as long as the model's context leaves room for the
  # 64 decode steps (the small model's context is 2048).
  context=$(grep -o '"max_position_embeddings": *[0-9]*' "${scratch}/${model}/config.json" |
    grep -o '[0-9]*$')
  for batch in "${batches[@]}"; do
    prompt=$((context - 64 < 2048 ? context - 64 : 2048))
    [[ "${batch}" != "1" ]] && prompt=512
    args=(engine --device cuda --model "${scratch}/${model}" --prompt-tokens "${prompt}"
      --decode-tokens 64 --repeats "${BENCH_REPEATS:-3}" --profile-ops)
    [[ "${batch}" != "1" ]] && args+=(--batch "${batch}")
    if [[ "${f32_bench}" == "1" ]]; then
      echo "== tandem-bench ${args[*]} --cuda-kernels reference" \
        "--json ${json_dir}/engine-${model}-batch${batch}.json"
      limited "${bench}" "${args[@]}" --cuda-kernels reference \
        --json "${json_dir}/engine-${model}-batch${batch}.json" || reference_failed=1
    fi
    if [[ "${fast}" == "1" ]]; then
      # The same run with the fast kernels, then also with bf16 compute; then
      # with the decode matmuls unordered (split-K with atomics, NOT
      # batch-invariant: what the fixed order costs, printed below).
      # The flash attention kernel last, with bf16 compute and fused
      # projections (the serving defaults), then the same with the
      # candidates for the next defaults: decode matmuls with their weights
      # staged through shared memory (--deep-skinny), a block per query tile of a prefill's
      # flash attention (--compact-attention) and a decode step's flash
      # attention with a whole split's K and V in flight (--deep-attention),
      # each the same bits; compared below (decode steps are recorded, where
      # the tiles are not used; the decode's attention and matmul calls are
      # compared apart from --profile-ops).
      # The fast kernels with fused projections alone (measured on the H200
      # of 2026-12-04, docs/cuda.md) run only with FUSED_FAST=1: their
      # minute goes to the candidates.
      variants=()
      [[ "${f32_bench}" == "1" ]] && variants+=("--cuda-kernels fast")
      variants+=("--cuda-kernels fast --compute-dtype bf16")
      [[ "${UNORDERED:-1}" == "1" ]] &&
        variants+=("--cuda-kernels fast --compute-dtype bf16 --unordered-decode")
      [[ "${FUSED_FAST:-0}" == "1" ]] &&
        variants+=("--cuda-kernels fast --compute-dtype bf16 --fuse-projections")
      [[ "${flash}" == "1" ]] &&
        variants+=("${serving_flags}")
      if [[ "${flash}" == "1" && "${candidates_failed}" == "0" ]]; then
        variants+=("${candidate_flags}")
      elif [[ "${flash}" == "1" ]]; then
        echo "== the candidates' benchmark run left out: their kernel tests or an earlier run" \
          "of theirs failed (above)"
      fi
      for variant in "${variants[@]}"; do
        read -r -a extra <<<"${variant}"
        # The plain bf16 run at batch 1 also times the bf16 GEMM's
        # configurations side by side (layer 0's matmuls at the prompt's
        # rows; the same bits in each, compared there).
        if [[ "${variant}" == "--cuda-kernels fast --compute-dtype bf16" && "${batch}" == "1" ]]; then
          if [[ "${wgmma_stuck}" == "0" ]]; then
            extra+=(--bf16-gemm-configs)
          else
            echo "== bf16 GEMM configurations not timed: the wgmma step hung or crashed (above)"
          fi
        fi
        # The flash runs also take the fastest bf16 GEMM configuration that
        # gave configuration 0's bits there (the serving one unless another
        # is faster on this GPU).
        if [[ "${variant}" == *flash* && -n "${gemm_config}" ]]; then
          extra+=(--bf16-gemm-config "${gemm_config}")
        fi
        name="$([[ "${variant}" == *flash* ]] && echo flash || echo fast)"
        name="${name}$([[ "${variant}" == *bf16* ]] && echo -bf16 || true)"
        name="${name}$([[ "${variant}" == *fuse* ]] && echo -fused || true)"
        name="${name}$([[ "${variant}" == *unordered* ]] && echo -unordered || true)"
        name="${name}$([[ "${variant}" == *deep* ]] && echo -deep || true)"
        echo "== tandem-bench ${args[*]} ${variant}"
        if ! limited "${bench}" "${args[@]}" "${extra[@]}" \
          --json "${json_dir}/engine-${model}-batch${batch}-${name}.json"; then
          if [[ "${variant}" == *deep* ]]; then
            candidates_failed=1
          elif [[ "${variant}" == *flash* ]]; then
            flash_failed=1
          else
            fast_failed=1
          fi
        fi
        if [[ "${variant}" == "--cuda-kernels fast --compute-dtype bf16" && "${batch}" == "1" ]]; then
          gemm_config="$(fastest_gemm_config "${json_dir}/engine-${model}-batch1-fast-bf16.json")"
          echo "== bf16 GEMM configuration for the flash runs: ${gemm_config:-the serving one}"
          # The kernel profile (PROFILE=1, below) takes the 8B shape's.
          if [[ "${model}" == "llama3-8b" ]]; then
            profile_gemm="${gemm_config}"
            profile_gemm_candidate="$(fastest_gemm_config \
              "${json_dir}/engine-${model}-batch1-fast-bf16.json" 6)"
          fi
        fi
      done
    fi
  done
done

# ---- the cost of batch invariance (docs/cuda.md) ------------------------------------------
# The bf16 decode step with the skinny kernel's fixed order over the same
# step with its unordered split-K variant, from the two runs above (each
# its own best of BENCH_REPEATS, one after the other).
for model in "${models[@]}"; do
  for batch in "${batches[@]}"; do
    run="${json_dir}/engine-${model}-batch${batch}-fast-bf16"
    [[ -f "${run}.json" && -f "${run}-unordered.json" ]] || continue
    ordered_ms=$(grep -o '"decode_step_s": *[0-9.e+-]*' "${run}.json" | grep -o '[0-9.e+-]*$')
    unordered_ms=$(grep -o '"decode_step_s": *[0-9.e+-]*' "${run}-unordered.json" |
      grep -o '[0-9.e+-]*$')
    awk -v m="${model}" -v b="${batch}" -v o="${ordered_ms}" -v u="${unordered_ms}" 'BEGIN {
      printf "== cost of batch invariance, %s batch %s: bf16 decode step %.3f ms fixed order, " \
        "%.3f ms unordered split-K: %.3f\n", m, b, o * 1e3, u * 1e3, o / u }'
  done
done

# ---- a host-sampled step's logits copied back (docs/cuda.md#memory-and-batches) -----------
# Into pageable memory and into the model runner's page-locked buffer, the
# decode step with the logits brought to the host over the greedy step, and
# the step's rows sampled with temperature and top-p on the host's threads
# and on one (docs/engine.md#sampling), from the serving flash run's figures.
for model in "${models[@]}"; do
  for batch in "${batches[@]}"; do
    run="${json_dir}/engine-${model}-batch${batch}-flash-bf16-fused.json"
    [[ -f "${run}" ]] || continue
    python3 - "${run}" "${model}" "${batch}" <<'PY' || true
import json, sys
run = json.load(open(sys.argv[1]))
if "logits_copy_page_locked_ms" in run:
    pageable, locked = run["logits_copy_pageable_ms"], run["logits_copy_page_locked_ms"]
    print(f"== logits copy back, {sys.argv[2]} batch {sys.argv[3]}: {pageable:.3f} ms into "
          f"pageable memory, {locked:.3f} ms page-locked ({pageable / locked:.3f})")
if "decode_step_host_logits_s" in run:
    greedy, host = run["decode_step_s"] * 1e3, run["decode_step_host_logits_s"] * 1e3
    print(f"== decode step with the logits on the host (sampled requests), {sys.argv[2]} batch "
          f"{sys.argv[3]}: {host:.3f} ms, greedy {greedy:.3f} ms ({host / greedy:.3f})")
if "sampling_step_s" in run:
    greedy = run["decode_step_s"] * 1e3
    pool, one = run["sampling_step_s"] * 1e3, run["sampling_step_one_thread_s"] * 1e3
    print(f"== a step's rows sampled on the host (T 0.6, top-p 0.9), {sys.argv[2]} batch "
          f"{sys.argv[3]}: {pool:.3f} ms on the kernels' threads, {one:.3f} on one "
          f"({one / pool:.3f}); {pool / greedy:.3f} of the greedy step")
PY
  done
done

# ---- the candidates: deep decode and attention loads, compact attention grid (docs/cuda.md) -
# Not yet defaults: their bits are checked by gpu_cuda_kernels_test's
# Candidate tests (the candidates step above); here the decode step (deep loads), the prefill
# (compact grid) and the decode's attention and matmul calls over the
# serving configuration's, from the two flash runs above.
for model in "${models[@]}"; do
  for batch in "${batches[@]}"; do
    run="${json_dir}/engine-${model}-batch${batch}-flash-bf16-fused"
    [[ -f "${run}.json" && -f "${run}-deep.json" ]] || continue
    plain_s=$(grep -o '"decode_step_s": *[0-9.e+-]*' "${run}.json" | grep -o '[0-9.e+-]*$')
    deep_s=$(grep -o '"decode_step_s": *[0-9.e+-]*' "${run}-deep.json" | grep -o '[0-9.e+-]*$')
    awk -v m="${model}" -v b="${batch}" -v p="${plain_s}" -v d="${deep_s}" 'BEGIN {
      printf "== deep decode and attention loads, %s batch %s: decode step %.3f ms serving, " \
        "%.3f ms deep: %.3f\n", m, b, p * 1e3, d * 1e3, p / d }'
    plain_p=$(grep -o '"prefill_tokens_per_s": *[0-9.e+-]*' "${run}.json" | grep -o '[0-9.e+-]*$')
    tiled_p=$(grep -o '"prefill_tokens_per_s": *[0-9.e+-]*' "${run}-deep.json" | grep -o '[0-9.e+-]*$')
    awk -v m="${model}" -v b="${batch}" -v p="${plain_p}" -v t="${tiled_p}" 'BEGIN {
      printf "== compact attention grid, %s batch %s: prefill %.1f tok/s a block per row, " \
        "%.1f a block per tile: %.3f\n", m, b, p, t, t / p }'
    # The candidates keep the serving kernels' bits: the prompt's logits and
    # every row's at the last decode step, digest for digest (a difference
    # fails them: the goals, the profile and the summary count them out).
    if ! python3 - "${run}.json" "${run}-deep.json" "${model}" "${batch}" <<'PY'; then
import json, sys
serving, deep = (json.load(open(path)) for path in sys.argv[1:3])
keys = ("prompt_logits_xxh3", "decode_logits_xxh3")
if not all(k in serving and k in deep for k in keys):
    print(f"== candidates' logits, {sys.argv[3]} batch {sys.argv[4]}: not compared (no digests)")
    sys.exit(0)
same = all(serving[k] == deep[k] for k in keys)
print(f"== candidates' logits, {sys.argv[3]} batch {sys.argv[4]}: prompt "
      f"{deep[keys[0]]}, last decode step {deep[keys[1]]}: "
      + ("equal to the serving run's" if same else
         f"DIFFER from the serving run's ({serving[keys[0]]}, {serving[keys[1]]})"))
sys.exit(0 if same else 1)
PY
      candidates_failed=1
    fi
    # The decode calls timed alone (--profile-ops): attention (deep attention
    # loads) and the matmuls (deep decode loads), ms per step each; and the
    # prefill's attention calls (compact grid).
    python3 - "${run}.json" "${run}-deep.json" "${model}" "${batch}" <<'PY' || true
import json, sys
def split(path, phase="decode"):
    calls = json.load(open(path))["ops"][phase]["calls"]
    pick = lambda prefix: sum(c["seconds_per_step"] for c in calls if c["call"].startswith(prefix))
    return pick("pagedAttention") * 1e3, pick("matmul") * 1e3
(pa, pm), (da, dm) = split(sys.argv[1]), split(sys.argv[2])
print(f"== decode calls timed alone, {sys.argv[3]} batch {sys.argv[4]}: attention {pa:.3f} ms "
      f"per step, {da:.3f} with whole splits in flight ({pa / da:.3f}); matmuls {pm:.3f} ms, "
      f"{dm:.3f} with deep loads ({pm / dm:.3f})")
(pa, _), (ta, _) = split(sys.argv[1], "prefill"), split(sys.argv[2], "prefill")
print(f"== prefill attention timed alone, {sys.argv[3]} batch {sys.argv[4]}'s prompt: {pa:.3f} ms "
      f"per prefill a block per row "
      f"and split, {ta:.3f} a block per tile through runs of splits ({pa / ta:.3f})")
PY
  done
done

# ---- side by side with PyTorch (scripts/torch_compare.py, docs/cuda.md) -----------------
# Optional: where the interpreter imports torch and transformers. Per model,
# `tandem-agent serve --device cuda` answers fixed token-id prompts greedily
# (fetch-tandem) and is stopped; then PyTorch loads the same directory, runs
# the workloads of the tandem-bench runs above (read from their --json) and
# checks Tandem's tokens by the margin rule. Prints both sides and their ratios.
torch_python="${TORCH_PYTHON:-python3}"
torch_failed=()
# The interpreter runs with the machine's own libraries, not the packed ones.
torch_py() { env -u LD_LIBRARY_PATH -u UCX_MODULE_DIR "${torch_python}" "$@"; }
if [[ "${TORCH_COMPARE:-1}" == "0" ]]; then
  echo "== PyTorch comparison left out (TORCH_COMPARE=0)"
elif ! torch_py -c 'import torch, transformers' >/dev/null 2>&1; then
  echo "== PyTorch comparison skipped: ${torch_python} cannot import torch and transformers"
else
  for model in "${models[@]}"; do
    echo "== PyTorch side by side: ${model}"
    agent_log="${json_dir}/agent-${model}.log"
    "${build}/bin/tandem-agent" serve --model "${scratch}/${model}" --device cuda \
      --host 127.0.0.1 --port 0 --max-model-len 2048 >"${agent_log}" 2>&1 &
    agent_pid=$!
    # The agent prints "listening on HOST:PORT" once the model is loaded.
    agent_url=""
    deadline=$((SECONDS + 900))
    while [[ -z "${agent_url}" ]] && kill -0 "${agent_pid}" 2>/dev/null &&
      ((SECONDS < deadline)); do
      agent_url=$(sed -n '/^listening on /{s//http:\/\//p;q}' "${agent_log}")
      [[ -n "${agent_url}" ]] || sleep 0.5
    done
    fetched=0
    if [[ -z "${agent_url}" ]]; then
      echo "tandem-agent did not start listening (log: ${agent_log}):"
      tail -n 5 "${agent_log}"
    elif torch_py "${root}/scripts/torch_compare.py" fetch-tandem --url "${agent_url}" \
      --model "${scratch}/${model}" --out "${json_dir}/tandem-tokens-${model}.json"; then
      fetched=1
    fi
    kill "${agent_pid}" 2>/dev/null || true
    wait "${agent_pid}" 2>/dev/null || true
    if [[ "${fetched}" != "1" ]]; then
      torch_failed+=("${model}")
      continue
    fi
    # Tandem's side: the bf16-compute runs where they ran (PyTorch computes
    # in bf16 too), else the reference kernels'.
    # The flash run with fused projections first (the fastest
    # configuration) where its checks passed.
    best() {
      local run="${json_dir}/engine-${model}-batch$1"
      if [[ "${flash_failed}" == "0" && -f "${run}-flash-bf16-fused.json" ]]; then
        echo "${run}-flash-bf16-fused.json"
      elif [[ -f "${run}-fast-bf16.json" ]]; then
        echo "${run}-fast-bf16.json"
      else
        echo "${run}.json"
      fi
    }
    compare=(compare --model "${scratch}/${model}" --device cuda --dtype bf16
      --tandem-bench "$(best 1)"
      --tandem-tokens "${json_dir}/tandem-tokens-${model}.json"
      --out "${json_dir}/torch-${model}.json")
    if [[ -f "$(best 32)" ]]; then
      compare+=(--tandem-bench-batch "$(best 32)")
    fi
    # The bf16-compute run's prefill matmuls, shape by shape against cuBLAS.
    if [[ -f "${json_dir}/engine-${model}-batch1-fast-bf16.json" ]]; then
      compare+=(--tandem-bench-gemm "${json_dir}/engine-${model}-batch1-fast-bf16.json")
    fi
    torch_py "${root}/scripts/torch_compare.py" "${compare[@]}" ||
      torch_failed+=("${model}")
    echo "-- PyTorch side by side, ${model}: done (${SECONDS} s into the check)"
  done
fi
# ---- end of side by side with PyTorch ------------------------------------------------------

# ---- the figures against their goals (scripts/gpu_goals.py, docs/cuda.md) -----------------
# One table from the JSON files above: each kernel variant's decode ratios
# and prefill, the PyTorch ratios and the greedy-token agreement, each
# against its goal. A family whose checks failed does not count.
excluded=()
[[ "${reference_failed}" != "0" ]] && excluded+=(reference)
[[ "${fast_failed}" != "0" ]] && excluded+=(fast)
[[ "${flash_failed}" != "0" ]] && excluded+=(flash)
[[ "${candidates_failed}" != "0" ]] && excluded+=(candidates)
for model in "${models[@]}"; do
  echo "== goals: ${model}"
  env -u LD_LIBRARY_PATH python3 "${root}/scripts/gpu_goals.py" "${json_dir}" --model "${model}" \
    --exclude "$(
      IFS=,
      echo "${excluded[*]}"
    )" || echo "(gpu_goals.py failed; the figures are in ${json_dir})"
done

# ---- kernel profile (PROFILE=1, docs/cuda.md#kernel-profile) ----------------------------------
# Nsight Compute's counters (ncu, where the machine's runtime lets it read
# them) for the matmul and attention launches of a 2-layer model of the
# llama3-8b shape: a 2048-token prefill and two decode steps at batch 1, two
# at batch 32 after 512-token prompts, the first two launches of each kernel
# and launch configuration (so a decode layer's O and down projections, the
# same grid, are both seen); the serving flash configuration, then
# the candidates (with the fastest candidate GEMM configuration, 6 to 9, that gave
# configuration 0's bits in the --bf16-gemm-configs run above). One line per
# launch (scripts/ncu_summary.py): DRAM bytes and rate, each unit's share of
# its peak, occupancy, L2 bytes per DRAM byte, the largest warp stalls. The
# reports and their raw pages stay in the JSON folder. Last, so that a slow
# or failing profiler costs nothing above.
if [[ "${PROFILE:-0}" == "1" ]]; then
  # Nsight Compute's ncu (not another program of that name), the newest
  # installed where the PATH has none.
  ncu_bin=""
  for candidate in "$(command -v ncu || true)" /usr/local/cuda/bin/ncu \
    $(ls -d /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | sort -rV); do
    if [[ -z "${ncu_bin}" && -x "${candidate}" ]] &&
      env -u LD_LIBRARY_PATH "${candidate}" --version 2>/dev/null | grep -q "Nsight Compute"; then
      ncu_bin="${candidate}"
    fi
  done
  profiled="${scratch}/llama3-8b-2"
  if [[ -z "${ncu_bin}" ]]; then
    echo "== ncu not found: the kernel profile left out"
  elif ! "${build}/bin/tandem-model" --preset llama3-8b --layers 2 --out "${profiled}" \
    >/dev/null; then
    echo "== the profile's 2-layer model could not be written: the kernel profile left out"
  else
    read -r -a serving <<<"${serving_flags}"
    [[ -n "${profile_gemm:-}" ]] && serving+=(--bf16-gemm-config "${profile_gemm}")
    read -r -a candidates <<<"${candidate_flags}"
    [[ -n "${profile_gemm_candidate:-}" ]] && candidates+=(--bf16-gemm-config "${profile_gemm_candidate}")
    # The DRAM and L2 bytes, and the warp stall reasons by name (whatever
    # WarpStateStats shows of them).
    profile_metrics="dram__bytes.sum,lts__t_bytes.sum"
    for stall in long_scoreboard short_scoreboard wait barrier math_pipe_throttle mio_throttle \
      lg_throttle not_selected no_instruction dispatch_stall; do
      profile_metrics+=",smsp__average_warps_issue_stalled_${stall}_per_issue_active.ratio"
    done
    read -r -a profile_runs <<<"${PROFILE_RUNS:-batch1 batch32 batch1-candidates batch32-candidates}"
    for run in "${profile_runs[@]}"; do
      if [[ "${run}" == *candidates && "${candidates_failed}" != "0" ]]; then
        echo "== ncu: ${run} left out: the candidates' checks or runs failed (above)"
        continue
      fi
      if [[ -n "${CHECK_BUDGET:-}" ]] && ((SECONDS + ${PROFILE_TIMEOUT:-60} > CHECK_BUDGET)); then
        echo "== ncu: ${run} left out: it could end past CHECK_BUDGET=${CHECK_BUDGET} s" \
          "(${SECONDS} s into the check)"
        continue
      fi
      shape=(--prompt-tokens 2048)
      [[ "${run}" == batch32* ]] && shape=(--prompt-tokens 512 --batch 32)
      flags=("${serving[@]}")
      [[ "${run}" == *candidates ]] && flags=("${candidates[@]}")
      report="${json_dir}/ncu-${run}"
      # An earlier run's report would be read as this one's.
      rm -f "${report}".* "${report}-raw.csv"
      echo "== ncu: tandem-bench engine ${shape[*]} --decode-tokens 2 ${flags[*]}"
      # ncu runs with the machine's own libraries, the program it starts
      # with the packed ones.
      if ! STEP_TIMEOUT="${PROFILE_TIMEOUT:-60}" limited env -u LD_LIBRARY_PATH \
        "${ncu_bin}" --clock-control none \
        --kernel-name "regex:bf16Mma|bf16Wgmma|bf16Copied|attentionFlash|attentionCombine" \
        --filter-mode per-launch-config --launch-count 2 --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section Occupancy --section LaunchStats --section WarpStateStats \
        --metrics "${profile_metrics}" --export "${report}" --force-overwrite \
        env "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}" \
        "${bench}" engine --device cuda --model "${profiled}" "${shape[@]}" --decode-tokens 2 \
        --repeats 1 "${flags[@]}" >"${report}.log" 2>&1; then
        echo "== ncu failed or was stopped (${report}.log):"
        tail -n 5 "${report}.log"
      fi
      if [[ -f "${report}.ncu-rep" ]] &&
        env -u LD_LIBRARY_PATH LC_ALL=C "${ncu_bin}" --import "${report}.ncu-rep" --csv \
        --page raw --print-units base >"${report}-raw.csv" 2>>"${report}.log"; then
        env -u LD_LIBRARY_PATH python3 "${root}/scripts/ncu_summary.py" "${report}-raw.csv" \
          --json "${report}.json" || true
      fi
    done
  fi
fi

echo "== the check took ${SECONDS} s${CHECK_BUDGET:+ (CHECK_BUDGET=${CHECK_BUDGET} s)}"
if ((${#torch_failed[@]} > 0)); then
  echo "== PyTorch comparison FAILED for: ${torch_failed[*]}"
  exit 1
fi
if [[ "${reference_failed}" != "0" ]]; then
  echo "== reference kernels: a gpu test or benchmark run FAILED (see above)"
  exit 1
fi
if [[ "${wgmma_failed}" != "0" ]]; then
  echo "== wgmma (bf16 GEMM configurations 4 to 7; no serving path): a probe failed, the rows" \
    "differ from configuration 0's or compute-sanitizer found a hazard (see above)"
fi
if [[ "${candidates_failed}" != "0" ]]; then
  echo "== candidates (deep decode and attention loads, compact attention grid; no serving" \
    "path): a kernel test or their benchmark run FAILED, or their logits differ from the" \
    "serving run's, or compute-sanitizer found a hazard (see above)"
fi
if [[ "${fast_failed}" != "0" ]]; then
  echo "== --cuda-kernels fast: a test or benchmark run FAILED (see above)"
  exit 1
fi
if [[ "${flash_failed}" != "0" ]]; then
  echo "== --cuda-kernels flash: a test or benchmark run FAILED (see above)"
  exit 1
fi
