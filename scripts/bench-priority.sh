#!/usr/bin/env bash
# What priority scheduling buys interactive requests beside a batch load
# (docs/benchmarks.md#priority-scheduling): the same two loads sent to an
# agent serving first come, first served and to one serving by priority,
# rounds alternating which goes first, in one run.
#
#   scripts/bench-priority.sh [--model DIR] [--rounds N] [--cluster] [--max-num-batched-tokens N] \
#       [--json FILE] BUILD_DIR
#
# Each measurement starts a fresh agent (--model, default models/small;
# --max-num-seqs 8, --max-num-batched-tokens as given, default 2048) or, with
# --cluster, a fresh local cluster (`tandem-operator local`: one prefill and
# one decode agent of one kernel thread each, with the same limits and
# policy, behind the router), sends the batch load (`tandem-bench serve`: 48
# prompts of 512 tokens, 96 tokens each, all at once) and, once an agent
# queues some of it, the interactive load (12 prompts of 64 tokens, 8
# tokens each, 2 a second). Under priority the batch requests carry priority 10 and the
# interactive ones 0; under fcfs neither carries one. Printed: each round's
# interactive TTFT and E2EL (median, p90) and the batch's output tokens/s,
# then the medians over rounds of priority / fcfs.
set -euo pipefail

model=models/small
rounds=3
cluster=
batched=2048
json_out=
while [[ $# -gt 0 && "$1" == --* ]]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --cluster) cluster=1; shift ;;
    --max-num-batched-tokens) batched="$2"; shift 2 ;;
    --json) json_out="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[[ $# -eq 1 ]] || { echo "usage: $0 [--model DIR] [--rounds N] [--cluster] [--max-num-batched-tokens N] [--json FILE] BUILD_DIR" >&2; exit 2; }
build="$(cd "$1" && pwd)"
[[ -x "$build/bin/tandem-agent" && -x "$build/bin/tandem-bench" && -x "$build/bin/tandem-operator" ]] ||
  { echo "no binaries in $build/bin" >&2; exit 1; }
[[ -f "$model/config.json" ]] || "$build/bin/tandem-model" --preset small --out "$model"

work=$(mktemp -d)
agent=
cleanup() {
  [[ -n "$agent" ]] && kill "$agent" 2>/dev/null || true
  wait 2>/dev/null || true
  [[ -n "${KEEP_WORK:-}" ]] && echo "kept $work" >&2 || rm -rf "$work"
}
trap cleanup EXIT

# port_of
source "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"

# A metric's value summed over the agents' /metrics (0 when absent).
metric() {
  local name="$1" total=0 port value
  for port in "${agent_ports[@]}"; do
    value=$(curl -sf "http://127.0.0.1:$port/metrics" |
      awk -v name="$name" 'index($1, name "{") == 1 || $1 == name {print $2; found=1; exit} END {if (!found) print 0}')
    total=$(python3 -c "print($total + $value)")
  done
  echo "$total"
}

# Starts the agent, or the local cluster; sets port (where clients go) and
# agent_ports.
start() {  # policy out
  local policy="$1" out="$2"
  if [[ -z "$cluster" ]]; then
    "$build/bin/tandem-agent" serve --model "$model" --port 0 --max-num-seqs 8 \
      --max-num-batched-tokens "$batched" --scheduling-policy "$policy" >"$out/agent.log" 2>&1 &
    agent=$!
    port=$(port_of "$out/agent.log")
    agent_ports=("$port")
    return
  fi
  local kind
  : >"$out/cluster.yaml"
  for kind in PrefillPool DecodePool; do
    cat >>"$out/cluster.yaml" <<YAML
apiVersion: tandem.dev/v1alpha1
kind: $kind
metadata: {name: ${kind,,}}
spec:
  replicas: 1
  model: {path: $model}
  engine: {kvCacheMemory: 512MiB, maxNumSeqs: 8, maxNumBatchedTokens: $batched, threads: 1,
           schedulingPolicy: $policy}
  kvTransfer: {connector: ucx, role: kv_both}
---
YAML
  done
  cat >>"$out/cluster.yaml" <<YAML
apiVersion: tandem.dev/v1alpha1
kind: Router
metadata: {name: router}
spec: {host: 127.0.0.1, port: 0, policy: kv}
YAML
  "$build/bin/tandem-operator" local -f "$out/cluster.yaml" >"$out/local.log" 2>&1 &
  agent=$!
  for _ in $(seq 1 600); do
    grep -q "router listening on" "$out/local.log" && [[ $(grep -c "\] listening on" "$out/local.log") -ge 2 ]] && break
    sleep 0.1
  done
  port=$(grep -m1 -o "router listening on [^ ]*" "$out/local.log" | sed 's/.*://')
  mapfile -t agent_ports < <(grep -o "\] listening on [^ ]*" "$out/local.log" | sed 's/.*://')
  [[ -n "$port" && ${#agent_ports[@]} -eq 2 ]] || { cat "$out/local.log" >&2; exit 1; }
  # Until the router has found both agents ready.
  for _ in $(seq 1 600); do
    curl -sf -o /dev/null -X POST "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
      -d "{\"model\": \"$(basename "$model")\", \"prompt\": [11, 12, 13], \"max_tokens\": 1}" && break
    sleep 0.1
  done
}

measure() {  # policy round
  local policy="$1" round="$2" out="$work/$1-$2"
  mkdir -p "$out"
  start "$policy" "$out"
  local batch_priority=() interactive_priority=()
  if [[ "$policy" == priority ]]; then
    batch_priority=(--priority 10)
    interactive_priority=(--priority 0)
  fi
  "$build/bin/tandem-bench" serve --url "http://127.0.0.1:$port" --num-prompts 48 \
    --input-len 512 --output-len 96 --vocab-range 100:2000 --seed "$round" \
    "${batch_priority[@]}" --json "$out/batch.json" >"$out/batch.log" 2>&1 &
  local batch=$!
  for _ in $(seq 1 300); do
    [[ "$(metric tandem_num_requests_waiting)" != 0 ]] && break
    sleep 0.1
  done
  "$build/bin/tandem-bench" serve --url "http://127.0.0.1:$port" --num-prompts 12 \
    --input-len 64 --output-len 8 --request-rate 2 --vocab-range 100:2000 \
    --seed "$((1000 + round))" "${interactive_priority[@]}" --json "$out/interactive.json" \
    >"$out/interactive.log" 2>&1 || true  # failed requests are counted in its JSON
  wait "$batch" || true
  metric tandem_priority_preemptions_total >"$out/priority_preemptions"
  kill "$agent"
  wait "$agent" 2>/dev/null || true
  agent=
}

for round in $(seq 1 "$rounds"); do
  if (( round % 2 == 1 )); then order=(fcfs priority); else order=(priority fcfs); fi
  for policy in "${order[@]}"; do
    echo "== round $round: $policy" >&2
    measure "$policy" "$round"
  done
done

python3 - "$work" "$rounds" "$json_out" <<'EOF'
import json, statistics, sys
work, rounds, json_out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = []
for r in range(1, rounds + 1):
    row = {"round": r}
    for policy in ("fcfs", "priority"):
        interactive = json.load(open(f"{work}/{policy}-{r}/interactive.json"))
        batch = json.load(open(f"{work}/{policy}-{r}/batch.json"))
        preemptions = float(open(f"{work}/{policy}-{r}/priority_preemptions").read().strip() or 0)
        row[policy] = {
            "interactive_ttft_ms": interactive["ttft_ms"],
            "interactive_e2el_ms": interactive["e2el_ms"],
            "interactive_failed": interactive["failed"],
            "batch_output_throughput": batch["output_throughput"],
            "batch_duration_s": batch["duration_s"],
            "batch_failed": batch["failed"],
            "priority_preemptions": preemptions,
        }
    rows.append(row)

def fmt(p):
    return (f"TTFT median {p['interactive_ttft_ms']['median']:8.1f} p90 {p['interactive_ttft_ms']['p90']:8.1f} ms"
            f" | E2EL median {p['interactive_e2el_ms']['median']:8.1f} ms"
            f" | batch {p['batch_output_throughput']:6.1f} tok/s in {p['batch_duration_s']:5.1f} s"
            f" | preemptions {p['priority_preemptions']:.0f}"
            f" | failed {p['interactive_failed'] + p['batch_failed']}")
for row in rows:
    for policy in ("fcfs", "priority"):
        print(f"round {row['round']} {policy:8s} {fmt(row[policy])}")
ratios = {
    "interactive_ttft_median": [r["priority"]["interactive_ttft_ms"]["median"] / r["fcfs"]["interactive_ttft_ms"]["median"] for r in rows],
    "interactive_ttft_p90": [r["priority"]["interactive_ttft_ms"]["p90"] / r["fcfs"]["interactive_ttft_ms"]["p90"] for r in rows],
    "interactive_e2el_median": [r["priority"]["interactive_e2el_ms"]["median"] / r["fcfs"]["interactive_e2el_ms"]["median"] for r in rows],
    "batch_output_throughput": [r["priority"]["batch_output_throughput"] / r["fcfs"]["batch_output_throughput"] for r in rows],
}
print("priority / fcfs, median over rounds (each round's ratio in brackets):")
for name, values in ratios.items():
    print(f"  {name:26s} {statistics.median(values):.3f}  [{' '.join(f'{v:.3f}' for v in values)}]")
if json_out:
    json.dump({"rounds": rows, "ratios": {k: {"median": statistics.median(v), "rounds": v} for k, v in ratios.items()}},
              open(json_out, "w"), indent=2)
EOF
