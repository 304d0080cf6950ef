// JSON parsing for untrusted headers and indexes: nesting depth is bounded (deep nesting would
// only exhaust the stack) and a key repeated in any object is refused (it would hide a value).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace ferry::detail {

// Throws FormatError naming `label` for invalid JSON, nesting deeper than `max_depth`, or a key
// that appears twice in one object.
nlohmann::json parse_strict_json(std::string_view text, std::string_view label, int max_depth);

// A short description of a JSON value for error messages: primitives as JSON, containers by kind
// (never a recursive dump of untrusted input).
std::string describe_json(const nlohmann::json& value);

}  // namespace ferry::detail
