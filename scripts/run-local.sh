#!/usr/bin/env bash
# `make run`: starts a local cluster (tandem-operator local), sends one
# streamed completion through its router, prints it and where it ran, then
# keeps serving until Ctrl-C.
#
#   scripts/run-local.sh [BUILD_DIR] [CLUSTER_FILE] [PORT]
#
# Run from the repository root (the example cluster files name models/small).
set -euo pipefail

build_dir=${1:-build}
cluster=${2:-examples/cluster.yaml}
port=${3:-8000}
url="http://127.0.0.1:$port"
prompt="The quick brown fox jumps over the lazy dog. Once upon a time, in a small \
village by the sea, there lived an old fisherman who told stories to the children \
every evening. One of his stories began like this:"

if curl -s -o /dev/null "$url/health"; then
  echo "run-local: something already listens on port $port; pass another port:" \
    "scripts/run-local.sh $build_dir $cluster PORT" >&2
  exit 1
fi

"$build_dir/bin/tandem-operator" local -f "$cluster" --port "$port" &
operator=$!
stop() {
  trap - EXIT INT TERM
  kill -TERM "$operator" 2>/dev/null || true
  wait "$operator" 2>/dev/null || true
}
trap stop EXIT
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM

# The router listens once every agent is healthy; it is healthy once it has
# seen a healthy decode agent.
for ((i = 0; ; i++)); do
  if ! kill -0 "$operator" 2>/dev/null; then
    status=0
    wait "$operator" || status=$?
    echo "run-local: tandem-operator exited with status $status (see above)" >&2
    exit 1
  fi
  curl -sf -o /dev/null "$url/health" && break
  if ((i >= 1200)); then
    echo "run-local: the router at $url was not healthy within 10 minutes" >&2
    exit 1
  fi
  sleep 0.5
done

model=$(curl -sf "$url/v1/models" | jq -r '.data[0].id')
headers=$(mktemp)
body=$(jq -n --arg model "$model" --arg prompt "$prompt" \
  '{model: $model, prompt: $prompt, max_tokens: 48, temperature: 0, stream: true}')

echo
echo "=== prompt:     $prompt"
printf '=== completion: '
curl -sN -D "$headers" -H 'content-type: application/json' -d "$body" "$url/v1/completions" |
  while IFS= read -r line; do
    line=${line%$'\r'}
    [[ $line == data:* ]] || continue
    data=${line#data: }
    [[ $data == "[DONE]" ]] && break
    jq -j 'if .error then "\n[error] " + (.error.message // (.error | tostring)) else .choices[0].text // "" end' \
      <<<"$data"
  done
echo
header() { grep -i -m1 "^$1:" "$headers" | cut -d: -f2- | tr -d '\r' | sed 's/^ *//'; }
echo "=== ran on:     prefill agent $(header x-tandem-prefill-agent)," \
  "decode agent $(header x-tandem-decode-agent) ($(header x-tandem-decision))," \
  "$(header x-tandem-kv-blocks-moved) KV blocks moved"
rm -f "$headers"

cat <<MESSAGE

The cluster keeps serving at $url (OpenAI API). Try:

  curl $url/v1/completions -H 'content-type: application/json' \\
    -d '{"model": "$model", "prompt": "Once upon a time", "max_tokens": 32, "stream": true}'

Edit $cluster (replicas) to add or remove agents; Ctrl-C stops the router and every agent.
MESSAGE
wait "$operator"
