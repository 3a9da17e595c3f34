// Validates outputs against JSON schemas with Ajv (draft 2020-12) and
// ajv-formats: the independent validator of the structured-output
// conformance test (tests/integration/structured_conformance_test.cpp).
//
//   NODE_PATH=DEST/node_modules node validate_json_schema.cjs CORPUS.jsonl OUTPUTS.jsonl
//
// CORPUS lines: {"source", "name", "schema"}. OUTPUTS lines: {"index": i,
// "text": "...", "finish_reason": "stop" | "length" | ...}; outputs that
// finished with "stop" are parsed and validated against corpus[i].schema,
// the others (cut by max_tokens) are not checked. Prints one JSON object:
// {"checked": n, "invalid": [{"index", "name", "text", "errors"}],
//  "unparsable": [{"index", "name", "text", "error"}]}.
// Exits 0 when it could run (whatever the outputs), 2 on bad input.
"use strict";

const fs = require("fs");
const Ajv2020 = require("ajv/dist/2020");
const addFormats = require("ajv-formats");

function readJsonl(path) {
  return fs
    .readFileSync(path, "utf8")
    .split("\n")
    .filter((line) => line.trim() !== "")
    .map((line, i) => {
      try {
        return JSON.parse(line);
      } catch (e) {
        throw new Error(`${path}:${i + 1}: ${e.message}`);
      }
    });
}

function main() {
  if (process.argv.length !== 4) {
    process.stderr.write("usage: node validate_json_schema.cjs CORPUS.jsonl OUTPUTS.jsonl\n");
    return 2;
  }
  const corpus = readJsonl(process.argv[2]);
  const outputs = readJsonl(process.argv[3]);
  // strict: false lets the test suite's schemas keep keywords Ajv's strict
  // mode warns about (unknown annotations, "items" beside "prefixItems"...);
  // ownProperties: a parsed object's members only, so that a property named
  // "constructor" or "toString" is not found on Object.prototype.
  const ajv = new Ajv2020({ strict: false, allErrors: true, ownProperties: true });
  addFormats(ajv);
  const validators = new Map();
  const result = { checked: 0, invalid: [], unparsable: [] };
  for (const output of outputs) {
    if (output.finish_reason !== "stop") continue;
    const entry = corpus[output.index];
    if (entry === undefined) throw new Error(`output index ${output.index} is not in the corpus`);
    let value;
    try {
      value = JSON.parse(output.text);
    } catch (e) {
      result.unparsable.push({ index: output.index, name: entry.name, text: output.text, error: e.message });
      continue;
    }
    if (!validators.has(output.index)) validators.set(output.index, ajv.compile(entry.schema));
    const validate = validators.get(output.index);
    ++result.checked;
    if (!validate(value)) {
      result.invalid.push({ index: output.index, name: entry.name, text: output.text, errors: validate.errors });
    }
  }
  process.stdout.write(JSON.stringify(result) + "\n");
  return 0;
}

try {
  process.exitCode = main();
} catch (e) {
  process.stderr.write(`validate_json_schema: ${e.message}\n`);
  process.exitCode = 2;
}
