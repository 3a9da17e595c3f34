#!/usr/bin/env bash
# Peak and remaining memory of an agent and of the router while clients send
# very large prompts, for one or two builds measured one after the other in
# the same run (docs/benchmarks.md#large-request-bodies).
#
#   scripts/bench-large-bodies.sh [--mb MB] [--concurrency 1,4] [--model DIR] \
#       [--truncate N] [--json FILE] BUILD_DIR [BASELINE_BUILD_DIR]
#
# For each build: one agent (--model, default models/small) serving alone, then
# the router of that build in front of it; `tandem-bench large-bodies` (from
# BUILD_DIR) sends the prompts to each and reads the process's VmRSS. With
# --truncate N each server gets the same prompts a second time with
# truncate_prompt_tokens N: tokenized whole and served, not refused by size.
set -euo pipefail

mb=60
concurrency=1,4
model=models/small
json_out=
truncate=0
while [[ $# -gt 0 && "$1" == --* ]]; do
  case "$1" in
    --mb) mb="$2"; shift 2 ;;
    --concurrency) concurrency="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --json) json_out="$2"; shift 2 ;;
    --truncate) truncate="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[[ $# -ge 1 ]] || { echo "usage: $0 [--mb MB] [--concurrency L] [--model DIR] [--truncate N] [--json F] BUILD_DIR [BASELINE_BUILD_DIR]" >&2; exit 2; }
builds=("$@")
bench="${TANDEM_BENCH:-$(cd "$1" && pwd)/bin/tandem-bench}"
[[ -x "$bench" ]] || { echo "no $bench" >&2; exit 1; }
[[ -f "$model/config.json" ]] || "$1/bin/tandem-model" --preset small --out "$model"

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# port_of
source "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"

results=()
for build in "${builds[@]}"; do
  build="$(cd "$build" && pwd)"
  label=$(git -C "$build/.." rev-parse --short HEAD 2>/dev/null || echo "$build")
  echo "==== build $build ($label)"
  "$build/bin/tandem-agent" serve --model "$model" --port 0 --max-model-len 2048 \
    >"$work/agent.log" 2>&1 &
  agent=$!
  pids+=("$agent")
  agent_port=$(port_of "$work/agent.log")
  "$build/bin/tandem-operator" router --port 0 --decode "decode-0=127.0.0.1:$agent_port" \
    --model-dir "$model" >"$work/router.log" 2>&1 &
  router=$!
  pids+=("$router")
  router_port=$(port_of "$work/router.log")
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$router_port/health" >/dev/null && break
    sleep 0.1
  done
  for who in agent router; do
    if [[ $who == agent ]]; then pid=$agent port=$agent_port; else pid=$router port=$router_port; fi
    passes=(0)
    [[ $truncate != 0 ]] && passes+=("$truncate")
    for cut in "${passes[@]}"; do
      echo "---- $who (pid $pid)$([[ $cut != 0 ]] && echo ", truncate_prompt_tokens $cut")"
      out="$work/$label-$who-$cut.json"
      "$bench" large-bodies --url "http://127.0.0.1:$port" --pid "$pid" --mb "$mb" \
        --concurrency "$concurrency" --truncate "$cut" --json "$out"
      results+=("$(jq -c --arg build "$label" --arg who "$who" '. + {build: $build, server: $who}' "$out")")
    done
  done
  kill "$router" "$agent"
  wait "$router" "$agent" 2>/dev/null || true
done
if [[ -n "$json_out" ]]; then
  printf '%s\n' "${results[@]}" | jq -s . >"$json_out"
  echo "figures written to $json_out"
fi
