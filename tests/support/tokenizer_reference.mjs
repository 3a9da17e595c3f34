// Writes a conformance case for a real tokenizer: its tokenizer.json and
// tokenizer_config.json, and expected.jsonl with what Hugging Face's
// reference implementation (@huggingface/tokenizers, the tokenizers of
// Transformers.js) gives for each text: {"text", "ids", "decoded"}, where
// ids is encode(text) without special tokens and decoded is decode(ids).
//
//   node tokenizer_reference.mjs NODE_MODULES FROM_DIR OUT_DIR [--metaspace] TEXTS.jsonl...
//
// --metaspace rewrites the tokenizer into the shape transformers writes for
// a SentencePiece tokenizer that is not "legacy" (Mistral v0.3 and later
// conversions): no normalizer, a Metaspace pre-tokenizer and decoder with
// prepend_scheme "first", split false. Its expected.jsonl has no "decoded":
// the reference's Metaspace decoder strips one space from the first token,
// where the Rust tokenizers that transformers and vLLM run drop every "▁"
// of it (common/tokenizer_pipeline.cpp, Decoder), so the two differ on a
// text that begins with several spaces; the unit tests check that rule.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [nodeModules, fromDir, outDir, ...rest] = process.argv.slice(2);
if (!nodeModules || !fromDir || !outDir || rest.length === 0) {
  console.error("usage: tokenizer_reference.mjs NODE_MODULES FROM_DIR OUT_DIR [--metaspace] TEXTS...");
  process.exit(2);
}
const metaspace = rest[0] === "--metaspace";
const textFiles = metaspace ? rest.slice(1) : rest;

const entry = path.join(nodeModules, "@huggingface/tokenizers/dist/tokenizers.mjs");
const { Tokenizer } = await import(pathToFileURL(entry).href);

const tokenizerJson = JSON.parse(fs.readFileSync(path.join(fromDir, "tokenizer.json"), "utf8"));
const tokenizerConfig = JSON.parse(
  fs.readFileSync(path.join(fromDir, "tokenizer_config.json"), "utf8"));
if (metaspace) {
  const scheme = { type: "Metaspace", replacement: "\u2581", prepend_scheme: "first", split: false };
  tokenizerJson.normalizer = null;
  tokenizerJson.pre_tokenizer = scheme;
  tokenizerJson.decoder = scheme;
}
const tokenizer = new Tokenizer(tokenizerJson, tokenizerConfig);

const lines = [];
for (const file of textFiles) {
  for (const line of fs.readFileSync(file, "utf8").split("\n")) {
    if (line.trim() === "") continue;
    const text = JSON.parse(line).text;
    const ids = tokenizer.encode(text, { add_special_tokens: false }).ids;
    const entry = { text, ids };
    // (The reference refuses to decode no ids; the text of none is "".)
    if (!metaspace) entry.decoded = ids.length > 0 ? tokenizer.decode(ids) : "";
    lines.push(JSON.stringify(entry));
  }
}

fs.mkdirSync(outDir, { recursive: true });
fs.writeFileSync(path.join(outDir, "tokenizer.json"), JSON.stringify(tokenizerJson));
fs.writeFileSync(path.join(outDir, "tokenizer_config.json"), JSON.stringify(tokenizerConfig));
fs.writeFileSync(path.join(outDir, "expected.jsonl"), lines.join("\n") + "\n");
console.log(`${outDir}: ${lines.length} reference encodings`);
