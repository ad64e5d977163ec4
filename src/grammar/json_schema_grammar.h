#pragma once
// JSON Schema to grammar: the JSON text a model writes under the grammar
// validates against the schema. Supported: type (and lists of types),
// properties, required, additionalProperties, enum, const, anyOf, oneOf
// (when its alternatives provably exclude each other), allOf of one schema,
// $ref into the document (#/$defs/..., #/definitions/..., recursion allowed),
// items, prefixItems (and draft-7 array items / additionalItems), minItems,
// maxItems, minLength, maxLength, pattern, format (date, time, date-time,
// uuid, email, ipv4), minimum / maximum / exclusiveMinimum / exclusiveMaximum
// (exact for integers and decimals), minProperties / maxProperties where the
// properties already decide them, and annotations (title, description, ...).
//
// Properties come in the order of `properties`; optional ones may be left
// out. Properties beyond them (additionalProperties true, absent or a schema,
// unless `strict`) come after, with names that differ from the listed ones.
// Anything else that constrains a value (not, if/then/else, patternProperties,
// uniqueItems, multipleOf, contains, ...) is refused: a serval::Error whose
// message names the keyword and where it is ("at #/properties/tags"), never a
// grammar that lets invalid output through.
#include <string_view>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "grammar/json_builtins.h"

namespace serval::grammar {

struct JsonSchemaOptions : JsonGrammarOptions {
  // OpenAI's strict mode: no properties beyond those listed in `properties`.
  bool strict = false;
};

Grammar json_schema_to_grammar(const nlohmann::ordered_json& schema, const JsonSchemaOptions& opts = {});
// The schema as JSON text (its key order is kept: it orders the properties).
Grammar json_schema_text_to_grammar(std::string_view schema_text, const JsonSchemaOptions& opts = {});

}  // namespace serval::grammar
