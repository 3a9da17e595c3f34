// Jinja's filters (`x | name(args)`) as chat templates use them, with
// Hugging Face's tojson (json.dumps, ensure_ascii off).
#pragma once

#include <string>

#include "common/jinja/value.h"

namespace tandem::jinja {

class Evaluator;

// HTML escaping as markupsafe's escape(): & < > " '.
std::string htmlEscape(const std::string& s);

// Applies filter `name`; throws RenderFailure for unknown filters and bad input.
Value applyFilter(Evaluator& ev, const std::string& name, const Value& input, const CallArgs& args);

}  // namespace tandem::jinja
