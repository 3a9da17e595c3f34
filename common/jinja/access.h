// Attribute and item access as jinja2's sandbox does it: `a.b` tries the
// attribute (methods of str, list and dict) and falls back to the item,
// `a[b]` tries the item and falls back to the attribute; misses give
// Undefined values that fail when used. Mutating methods (list.append,
// dict.update, ...) are refused, as ImmutableSandboxedEnvironment does.
#pragma once

#include <string>

#include "common/jinja/value.h"

namespace tandem::jinja {

Value getAttr(const Value& obj, const std::string& name);
Value getItem(const Value& obj, const Value& key);
// obj[start:stop:step] for lists, tuples and strings (code points).
Value sliceValue(const Value& obj, const Value& start, const Value& stop, const Value& step);
// Calls method `name` of a str, list or dict; nullopt when there is none.
bool hasMethod(const Value& obj, const std::string& name);
Value callMethod(const Value& obj, const std::string& name, const CallArgs& args);

}  // namespace tandem::jinja
