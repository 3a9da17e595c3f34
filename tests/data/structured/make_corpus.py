#!/usr/bin/env python3
"""Writes schemas.jsonl, the structured-output conformance corpus (README.md).

    make_corpus.py --test-suite GIT_DIR --gorilla GIT_DIR > schemas.jsonl

GIT_DIR: git directories (clones or bare mirrors) of
json-schema-org/JSON-Schema-Test-Suite and ShishirPatil/gorilla; files are
read at the commits pinned below, so the output does not depend on what the
clones hold beyond those commits. Deterministic: the same inputs give the
same bytes.
"""

import argparse
import json
import subprocess
import sys

TEST_SUITE_COMMIT = "44401e0c046704b476ec9d2e2fccdaee618f259d"
GORILLA_COMMIT = "6ea57973c7a6097fd7c5915698c54c17c5b1b6c8"

TEST_SUITE_DIR = "tests/draft2020-12"
TEST_SUITE_FILES = [
    "additionalProperties", "allOf", "anyOf", "boolean_schema", "const", "default", "defs",
    "enum", "exclusiveMaximum", "exclusiveMinimum", "format", "items", "maxItems", "maxLength",
    "maximum", "minItems", "minLength", "minimum", "oneOf", "pattern", "prefixItems",
    "properties", "ref", "required", "type", "optional/ecmascript-regex",
    "optional/non-bmp-regex", "optional/format/date", "optional/format/date-time",
    "optional/format/email", "optional/format/hostname", "optional/format/ipv4",
    "optional/format/time", "optional/format/uri", "optional/format/uuid",
]

BFCL_DIR = "berkeley-function-call-leaderboard/bfcl_eval/data"
# (file, how many functions to take). Every function of a file that
# converts cleanly is a candidate; the quota is spread evenly over them.
BFCL_FILES = [
    ("BFCL_v4_simple_python.json", 40),
    ("BFCL_v4_multiple.json", 25),
    ("BFCL_v4_parallel.json", 8),
    ("BFCL_v4_parallel_multiple.json", 12),
    ("BFCL_v4_irrelevance.json", 8),
    ("BFCL_v4_live_simple.json", 30),
    ("BFCL_v4_live_multiple.json", 30),
    ("BFCL_v4_live_parallel_multiple.json", 6),
    ("BFCL_v4_live_relevance.json", 4),
    ("BFCL_v4_live_irrelevance.json", 10),
    ("multi_turn_func_doc/gorilla_file_system.json", 4),
    ("multi_turn_func_doc/math_api.json", 3),
    ("multi_turn_func_doc/memory_kv.json", 2),
    ("multi_turn_func_doc/memory_vector.json", 2),
    ("multi_turn_func_doc/message_api.json", 2),
    ("multi_turn_func_doc/posting_api.json", 2),
    ("multi_turn_func_doc/ticket_api.json", 2),
    ("multi_turn_func_doc/trading_bot.json", 3),
    ("multi_turn_func_doc/travel_booking.json", 3),
    ("multi_turn_func_doc/vehicle_control.json", 3),
    ("multi_turn_func_doc/web_search.json", 2),
]

# BFCL writes Python's type names; these are their JSON Schema names.
BFCL_TYPES = {"dict": "object", "float": "number", "tuple": "array"}
JSON_TYPES = {"null", "boolean", "object", "array", "string", "number", "integer"}

FORMATS = {"date", "time", "date-time", "uuid", "email", "ipv4", "hostname", "uri"}
ANNOTATIONS = {"$comment", "title", "description", "default", "examples", "deprecated",
               "readOnly", "writeOnly"}
SUBSCHEMA_MAPS = {"properties", "$defs", "definitions"}
SUBSCHEMA_LISTS = {"prefixItems", "anyOf", "oneOf", "allOf"}
VALIDATION = {"type", "properties", "required", "additionalProperties", "items", "prefixItems",
              "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref",
              "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
              "exclusiveMinimum", "exclusiveMaximum"}
INTEGER_BOUNDS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
STRING_KEYWORDS = {"minLength", "maxLength", "pattern", "format"}


def git_show(git_dir, commit, path):
    return subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{path}"], check=True,
                          capture_output=True, text=True).stdout


# Test-suite cases left out though the compiler accepts them, with why.
EXCLUDED = {
    # oneOf is compiled as anyOf (docs/structured-outputs.md): where branches
    # overlap, an output may match several and fail oneOf.
    "oneOf: oneOf with boolean schemas, all true": "overlapping oneOf branches",
    "oneOf: oneOf with empty schema": "overlapping oneOf branches",
}

# Regex constructs the compiler refuses: Unicode properties, control escapes,
# and control characters a pattern requires (its strings cannot hold them).
REFUSED_PATTERN_PARTS = ("\\p", "\\P", "\\c", "\\t", "\\n", "\\r")


def type_of(value):
    if value is None:
        return {"null"}
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int):
        return {"integer", "number"}
    if isinstance(value, float):
        return {"integer", "number"} if value.is_integer() else {"number"}
    if isinstance(value, str):
        return {"string"}
    return {"array"} if isinstance(value, list) else {"object"}


def supported(schema, root=True, may_be_false=False):
    """Whether `schema` uses only what the compiler supports (docs/structured-outputs.md),
    with nothing the grammar would leave unchecked (keywords beside enum/const) and a value
    to generate: `false` only where a value may be left out (additionalProperties, items, a
    property), enums with a value of the schema's type."""
    if isinstance(schema, bool):
        return schema or may_be_false
    if not isinstance(schema, dict):
        return False
    allowed = VALIDATION | ANNOTATIONS | SUBSCHEMA_MAPS | ({"$schema"} if root else set())
    if any(key not in allowed for key in schema):
        return False
    keys = set(schema) - ANNOTATIONS - {"$schema", "$defs", "definitions"}
    if "$ref" in schema:
        if not isinstance(schema["$ref"], str) or not schema["$ref"].startswith("#"):
            return False
        if keys != {"$ref"}:
            return False
    if ("enum" in schema or "const" in schema) and not keys <= {"enum", "const", "type"}:
        return False
    if keys & {"anyOf", "oneOf", "allOf"} and len(keys) != 1:
        return False
    if "allOf" in schema and len(schema["allOf"]) != 1:
        return False
    if keys & INTEGER_BOUNDS and schema.get("type") != "integer":
        return False
    if len(keys & STRING_KEYWORDS - {"minLength", "maxLength"}) + bool(
            keys & {"minLength", "maxLength"}) > 1:
        return False
    if "enum" in schema:
        if not isinstance(schema["enum"], list) or not schema["enum"]:
            return False
        types = schema.get("type")
        types = set(types if isinstance(types, list) else [types]) if types else JSON_TYPES
        if not any(type_of(value) & types for value in schema["enum"]):
            return False
    if "pattern" in schema:
        pattern = schema["pattern"]
        if any(part in pattern for part in REFUSED_PATTERN_PARTS) or any(
                ord(c) < 0x20 for c in pattern):
            return False
    if "format" in schema and schema["format"] not in FORMATS:
        return False
    types = schema.get("type", [])
    for t in types if isinstance(types, list) else [types]:
        if t not in JSON_TYPES:
            return False
    for key in SUBSCHEMA_MAPS & set(schema):
        if not isinstance(schema[key], dict):
            return False
        if not all(supported(s, False, key == "properties") for s in schema[key].values()):
            return False
    for key in SUBSCHEMA_LISTS & set(schema):
        if not isinstance(schema[key], list):
            return False
        if not all(supported(s, False) for s in schema[key]):
            return False
    for key in ("items", "additionalProperties"):
        if key in schema and not supported(schema[key], False, True):
            return False
    return True


def test_suite_schemas(git_dir):
    for name in TEST_SUITE_FILES:
        path = f"{TEST_SUITE_DIR}/{name}.json"
        for group in json.loads(git_show(git_dir, TEST_SUITE_COMMIT, path)):
            schema = group["schema"]
            title = f"{name}: {group['description']}"
            if schema is False or not supported(schema) or title in EXCLUDED:
                continue
            yield {"source": f"JSON-Schema-Test-Suite {path}", "name": title, "schema": schema}


def convert_bfcl(schema):
    """BFCL's parameters with Python type names mapped to JSON Schema's; None when a
    type has no JSON Schema counterpart ("any", Java's names)."""
    if isinstance(schema, list):
        items = [convert_bfcl(s) for s in schema]
        return None if any(s is None for s in items) else items
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "type":
            value = BFCL_TYPES.get(value, value)
            if value not in JSON_TYPES:
                return None
        elif key in ("items", "additionalProperties", "anyOf", "oneOf", "allOf", "prefixItems"):
            value = convert_bfcl(value)
            if value is None:
                return None
        elif key == "properties" and isinstance(value, dict):
            converted = {}
            for name, sub in value.items():
                converted[name] = convert_bfcl(sub)
                if converted[name] is None:
                    return None
            value = converted
        out[key] = value
    return out


def bfcl_functions(git_dir, file):
    for line in git_show(git_dir, GORILLA_COMMIT, f"{BFCL_DIR}/{file}").splitlines():
        if not line.strip():
            continue
        entry = json.loads(line)
        for function in entry.get("function", [entry]):
            yield entry.get("id", file), function


def bfcl_schemas(git_dir, seen):
    for file, quota in BFCL_FILES:
        candidates = []
        for entry_id, function in bfcl_functions(git_dir, file):
            schema = convert_bfcl(function.get("parameters"))
            if not isinstance(schema, dict) or not supported(schema):
                continue
            key = json.dumps(schema, sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
            candidates.append({"source": f"gorilla {BFCL_DIR}/{file}",
                               "name": f"{entry_id}: {function['name']}", "schema": schema})
        step = max(1, len(candidates) // quota)
        yield from candidates[::step][:quota]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--test-suite", required=True)
    parser.add_argument("--gorilla", required=True)
    args = parser.parse_args()
    seen = set()
    out = []
    for entry in test_suite_schemas(args.test_suite):
        schema = entry["schema"]
        key = json.dumps({k: v for k, v in schema.items() if k != "$schema"}
                         if isinstance(schema, dict) else schema, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(entry)
    out.extend(bfcl_schemas(args.gorilla, seen))
    for entry in out:
        sys.stdout.write(json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
