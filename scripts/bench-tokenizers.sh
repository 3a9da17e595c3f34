#!/usr/bin/env bash
# Tokenizing speed of each real tokenizer the tests hold, Tandem beside
# Hugging Face's JS implementation (@huggingface/tokenizers, the reference
# the conformance tests use), in one run on one input.
#
#   scripts/bench-tokenizers.sh [--repeat N] [--json FILE] BUILD_DIR
#
# The input is the texts of the llama3 conformance corpus (prose, code,
# many scripts, emoji) and sentencepiece_texts.jsonl, repeated N times
# (default 25, about 5 MB), as JSON lines. Tandem: `tandem-agent tokenize`
# over it, minus the same command over no input (load time, reported on
# its own). Reference: the same texts through Tokenizer.encode in node,
# timed around the encode loop only. Each tokenizer is run twice, in
# alternating order, and the faster of each side's runs is kept.
# Figures: MB/s of UTF-8 text, and Tandem ÷ reference.
set -euo pipefail

REPEAT=25
JSON_OUT=
while [ $# -gt 1 ]; do
  case "$1" in
    --repeat) REPEAT=$2; shift 2 ;;
    --json) JSON_OUT=$2; shift 2 ;;
    *) echo "bench-tokenizers: unknown option $1" >&2; exit 2 ;;
  esac
done
BUILD=${1:?usage: bench-tokenizers.sh [--repeat N] [--json FILE] BUILD_DIR}
DATA=$BUILD/test-data/tokenizers
NODE_MODULES=$BUILD/third_party/node/node_modules
SRC=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

python3 - "$REPEAT" "$WORK/input.jsonl" "$SRC/tests/data/tokenizers/llama3/expected.jsonl" \
  "$SRC/tests/data/tokenizers/sentencepiece_texts.jsonl" <<'EOF'
import json, sys
repeat, out = int(sys.argv[1]), sys.argv[2]
texts = [json.loads(l)["text"] for f in sys.argv[3:] for l in open(f, encoding="utf-8") if l.strip()]
with open(out, "w", encoding="utf-8") as f:
    for _ in range(repeat):
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
EOF
BYTES=$(python3 -c "
import json,sys
print(sum(len(json.loads(l)['text'].encode()) for l in open(sys.argv[1], encoding='utf-8')))" "$WORK/input.jsonl")

cat > "$WORK/reference.mjs" <<'EOF'
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";
const [nodeModules, dir, input] = process.argv.slice(2);
const { Tokenizer } = await import(
  pathToFileURL(path.join(nodeModules, "@huggingface/tokenizers/dist/tokenizers.mjs")).href);
const texts = fs.readFileSync(input, "utf8").split("\n").filter((l) => l).map((l) => JSON.parse(l).text);
const loadStart = process.hrtime.bigint();
const tokenizer = new Tokenizer(JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8")),
                                JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8")));
const start = process.hrtime.bigint();
let ids = 0;
for (const text of texts) ids += tokenizer.encode(text, { add_special_tokens: false }).ids.length;
const end = process.hrtime.bigint();
console.log(JSON.stringify({ load_s: Number(start - loadStart) / 1e9, encode_s: Number(end - start) / 1e9, ids }));
EOF

now() { date +%s.%N; }
tandem_run() {  # dir input → seconds
  local start end
  start=$(now)
  "$BUILD/bin/tandem-agent" tokenize --tokenizer "$1" < "$2" > "$WORK/ids.jsonl"
  end=$(now)
  python3 -c "print($end - $start)"
}

ISA=avx2
grep -q avx512bw /proc/cpuinfo && ISA=avx512
printf 'input: %s texts, %.2f MB of UTF-8; CPU: %s (%s, %s cores)\n' "$(wc -l < "$WORK/input.jsonl")" \
  "$(python3 -c "print($BYTES / 1e6)")" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)" \
  "$ISA" "$(nproc)"
printf '%-18s %10s %12s %12s %12s %10s\n' tokenizer "load s" "Tandem MB/s" "ref MB/s" "ref load s" "ratio"
: > "$WORK/rows.jsonl"
: > "$WORK/empty.jsonl"
for name in llama3 qwen3 mistral mistral-metaspace gemma3; do
  dir=$DATA/$name
  [ -f "$dir/tokenizer.json" ] || { echo "$name: $dir missing (make build writes it)" >&2; continue; }
  best_tandem=; best_ref=; load=; ref_load=
  for round in 1 2; do
    for side in tandem reference; do
      # Alternate which side goes first.
      if [ $((round % 2)) = 0 ]; then side=$([ "$side" = tandem ] && echo reference || echo tandem); fi
      if [ "$side" = tandem ]; then
        l=$(tandem_run "$dir" "$WORK/empty.jsonl")
        t=$(tandem_run "$dir" "$WORK/input.jsonl")
        e=$(python3 -c "print(max($t - $l, 1e-9))")
        if [ -z "$best_tandem" ] || python3 -c "import sys; sys.exit(0 if $e < $best_tandem else 1)"; then
          best_tandem=$e; load=$l
        fi
      else
        r=$(node "$WORK/reference.mjs" "$NODE_MODULES" "$dir" "$WORK/input.jsonl")
        e=$(python3 -c "import json; print(json.loads('$r')['encode_s'])")
        if [ -z "$best_ref" ] || python3 -c "import sys; sys.exit(0 if $e < $best_ref else 1)"; then
          best_ref=$e; ref_load=$(python3 -c "import json; print(json.loads('$r')['load_s'])")
        fi
      fi
    done
  done
  python3 - "$name" "$BYTES" "$best_tandem" "$load" "$best_ref" "$ref_load" "$WORK/rows.jsonl" <<'EOF'
import json, sys
name, size, tandem, load, ref, ref_load, rows = sys.argv[1], int(sys.argv[2]), *map(float, sys.argv[3:7]), sys.argv[7]
row = {"tokenizer": name, "bytes": size, "tandem_load_s": load, "tandem_mb_s": size / tandem / 1e6,
       "reference_load_s": ref_load, "reference_mb_s": size / ref / 1e6}
row["ratio"] = row["tandem_mb_s"] / row["reference_mb_s"]
print(f"{name:<18} {load:10.3f} {row['tandem_mb_s']:12.2f} {row['reference_mb_s']:12.2f} {ref_load:12.3f} {row['ratio']:10.2f}")
open(rows, "a").write(json.dumps(row) + "\n")
EOF
done
if [ -n "$JSON_OUT" ]; then
  python3 -c "
import json,sys
print(json.dumps({'rows': [json.loads(l) for l in open(sys.argv[1])]}, indent=1))" "$WORK/rows.jsonl" > "$JSON_OUT"
  echo "wrote $JSON_OUT"
fi
