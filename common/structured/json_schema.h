// JSON Schema to grammar: the constraint behind `response_format:
// {"type": "json_schema"}` and strict tool calls.
//
// compileJsonSchema turns a schema into a Grammar (grammar.h) whose sentences
// are compact JSON texts (no whitespace between tokens: {"a":1,"b":[true]})
// valid against the schema. The grammar may allow fewer texts than the
// schema does (it never allows more, except where noted below), so whatever
// the model generates under it validates.
//
// Supported (the subset OpenAI's strict mode accepts, and a little more):
//   - true (any value); {} and schemas of annotations only (any value).
//   - type: null, boolean, object, array, string, number, integer, or an
//     array of them. Without `type`, the types whose keywords appear
//     (properties -> object, items -> array, minLength or format -> string,
//     ...), or any value when none do.
//   - objects: properties (emitted in the schema's order), required (those
//     always present; the others may be left out), additionalProperties:
//     false, true or a schema. additionalProperties defaults to false, as in
//     OpenAI's strict mode, when the schema has `properties` or `required`;
//     an object schema with neither allows any members. Extra members come
//     after the declared ones, with keys other than the declared names
//     (written with the shortest escape for each character); two extra
//     members may share a key. A required name missing from `properties`
//     takes any value.
//   - arrays: items, prefixItems, minItems, maxItems (items as an array with
//     additionalItems, the older tuple form, too).
//   - strings: minLength and maxLength (characters; an escape sequence is one
//     character), pattern (matched as a whole, as if anchored at both ends),
//     format: date (the days each month has), time, date-time, uuid, email,
//     ipv4, hostname (253 characters at most: up to three labels of up to
//     63 characters or four to eight of up to 30), uri (RFC 3986 without IP
//     literals or an empty path). At most one of length bounds, pattern and
//     format per schema. \u escapes never
//     name a surrogate (characters beyond U+FFFF are written as UTF-8).
//   - integers: minimum, maximum, exclusiveMinimum, exclusiveMaximum (the
//     draft-4 boolean form too), exact ranges. Numbers take no bounds.
//   - enum and const: their values, in compact form, filtered by `type`
//     when both appear; other keywords beside them are not applied.
//   - anyOf, and oneOf read as anyOf (a text may match several branches);
//     allOf with exactly one subschema.
//   - $ref: "#" and JSON pointers into the document ("#/$defs/Name",
//     "#/definitions/Name", ...; ~0, ~1 and %-escapes decoded). Each
//     referenced subschema is one rule, so recursive schemas work.
//     $ref, anyOf, oneOf and allOf take only annotations beside them.
// Annotations (title, description, default, examples, $schema, $id,
// $comment, deprecated, readOnly, writeOnly, ...) and keywords unknown to
// JSON Schema are ignored, as the specification says.
//
// Errors name the keyword and where it is as a JSON pointer (RFC 6901; the
// document itself is "(root)"): InvalidArgument for what is not supported
// or cannot be satisfied (a `false` schema where a value is needed, a $ref
// that does not resolve, a refused keyword such as "multipleOf", a schema
// whose every value would have to contain itself);
// ResourceExhausted naming the bound for schemas past JsonSchemaLimits and
// grammars past GrammarLimits.
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "common/status.h"
#include "common/structured/grammar.h"

namespace tandem::structured {

struct JsonSchemaLimits {
  int64_t max_depth = 32;      // subschemas nested in one another ($ref targets start again)
  int64_t max_nodes = 10'000;  // subschemas compiled, in all
  int64_t max_enum_values = 1'000;
  GrammarLimits grammar;  // passed to GrammarBuilder::build
};

// A grammar for the compact JSON texts valid against `schema`. Properties
// are generated in the iteration order of the schema's `properties` object,
// which ordered_json keeps as written.
StatusOr<Grammar> compileJsonSchema(const nlohmann::ordered_json& schema,
                                    const JsonSchemaLimits& limits = {});

// The same rules added to `builder` (named `name` + each subschema's JSON
// pointer), for a grammar that embeds the schema's values (tool calls);
// the root rule's id. Refusals as compileJsonSchema's; a subschema with no
// finite value is refused when the caller builds (GrammarBuilder::build's
// require_finite), naming its rule.
StatusOr<int32_t> addJsonSchemaRule(GrammarBuilder& builder, const nlohmann::ordered_json& schema,
                                    const std::string& name, const JsonSchemaLimits& limits = {});

// A rule for any compact JSON object, added to `builder`.
int32_t addAnyJsonObjectRule(GrammarBuilder& builder);

// Any compact JSON object (response_format {"type": "json_object"}): members
// with any values, nested arbitrarily; keys may repeat.
Grammar anyJsonObjectGrammar();

}  // namespace tandem::structured
