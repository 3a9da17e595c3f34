#!/usr/bin/env bash
# Routing policies side by side on 8 prefill + 8 decode simulated agents
# (examples/sim-8p8d.yaml, the Llama-3.1-8B-on-H100 profile): four workloads,
# each run as interleaved rounds of every policy on fresh clusters by
# `tandem-bench multiturn --rounds` (docs/benchmarks.md#routing-policies-side-by-side-8--8-simulated-agents).
#
#   scripts/bench-routing.sh [--rounds N] [--policies P,...] [--out DIR] [WORKLOAD...]
#
# WORKLOAD: a (long shared prefix, short turns), b (short prefix, long
# history), hot (8 long system prompts, Zipf 1.2 popularity, a few turns),
# none (single-turn prompts, nothing shared), sat (b's conversations from 96
# clients on accelerators 4x slower, SLO 4x looser: a saturated cluster);
# default all five. Each writes
# DIR/<workload>.json and DIR/<workload>.log (DIR default bench-routing).
set -euo pipefail

rounds=3
policies=kv,round_robin,dynamo,llm_d,sglang
out=bench-routing
while [[ $# -gt 0 && "$1" == --* ]]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --policies) policies="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
workloads=("$@")
[[ ${#workloads[@]} -gt 0 ]] || workloads=(a b hot none sat)
bench="${TANDEM_BENCH:-build/bin/tandem-bench}"
[[ -x "$bench" ]] || { echo "no $bench: run make build first" >&2; exit 1; }
mkdir -p "$out"
# The cluster's model directory: the tiny test model (4 KiB stand-in blocks).
[[ -f models/tiny/config.json ]] || "$(dirname "$bench")/tandem-model" --preset tiny --out models/tiny

common=(--policies "$policies" --rounds "$rounds" --vocab-range 10:500 --seed 7)
h100=(--cluster-file examples/sim-8p8d.yaml --slo-ttft-ms 200 --slo-itl-ms 25)
# sat: the same cluster with the profile's scale at 4 (every step 4x longer).
sed 's/^scale: .*/scale: 4.0/; s/^name: .*/name: llama3.1-8b-h100-x4/' \
  profiles/llama3.1-8b-h100.yaml > "$out/llama3.1-8b-h100-x4.yaml"
case "$out" in /*) out_abs="$out" ;; *) out_abs="$PWD/$out" ;; esac
sed "s#profiles/llama3.1-8b-h100.yaml#$out_abs/llama3.1-8b-h100-x4.yaml#" \
  examples/sim-8p8d.yaml > "$out/sim-8p8d-x4.yaml"
slow=(--cluster-file "$out/sim-8p8d-x4.yaml" --slo-ttft-ms 800 --slo-itl-ms 100)
# One unmeasured run first: the first cluster started on a cold machine (page
# cache, first UCX connections) is slower, whichever policy it runs.
"$bench" multiturn --cluster-file examples/sim-8p8d.yaml --policies round_robin \
  --num-clients 32 --num-conversations 32 --turns 2 --shared-prefix-tokens 512 \
  --input-tokens uniform:128,256 --output-tokens constant:16 --vocab-range 10:500 \
  > "$out/warmup.log" 2>&1 || { tail -20 "$out/warmup.log"; exit 1; }
for workload in "${workloads[@]}"; do
  case "$workload" in
    a) args=("${h100[@]}" --num-clients 32 --num-conversations 64 --turns 4 --shared-prefix-tokens 1024
             --input-tokens uniform:128,256 --output-tokens constant:32) ;;
    b) args=("${h100[@]}" --num-clients 32 --num-conversations 64 --turns 8 --shared-prefix-tokens 128
             --input-tokens uniform:512,1024 --output-tokens constant:32) ;;
    hot) args=("${h100[@]}" --num-clients 32 --num-conversations 128 --turns 3 --prefix-groups 8
               --prefix-zipf 1.2 --shared-prefix-tokens 2048 --input-tokens uniform:64,256
               --output-tokens constant:32) ;;
    none) args=("${h100[@]}" --num-clients 32 --num-conversations 256 --turns 1 --shared-prefix-tokens 0
                --input-tokens uniform:512,2048 --output-tokens constant:32) ;;
    sat) args=("${slow[@]}" --num-clients 96 --num-conversations 192 --turns 4
               --shared-prefix-tokens 128 --input-tokens uniform:512,1024
               --output-tokens constant:32) ;;
    *) echo "unknown workload $workload (a, b, hot, none, sat)" >&2; exit 2 ;;
  esac
  echo "== workload $workload"
  "$bench" multiturn "${common[@]}" "${args[@]}" --json "$out/$workload.json" \
    > "$out/$workload.log" 2>&1 || { tail -20 "$out/$workload.log"; exit 1; }
  sed -n '/^figure  /,$p' "$out/$workload.log" | tail -n +1
done
