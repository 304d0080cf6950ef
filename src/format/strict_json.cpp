#include "format/strict_json.hpp"

#include <set>
#include <string>
#include <vector>

#include "ferry/error.hpp"

namespace ferry::detail {

nlohmann::json parse_strict_json(std::string_view text, std::string_view label, int max_depth) {
  using Json = nlohmann::json;
  std::vector<std::set<std::string>> keys;  // one set per open object
  auto on_event = [&](int depth, Json::parse_event_t event, Json& parsed) {
    FERRY_FORMAT_EXPECT(depth <= max_depth, label, ": JSON nests deeper than ", max_depth,
                        " levels");
    switch (event) {
      case Json::parse_event_t::object_start:
        keys.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        keys.pop_back();
        break;
      case Json::parse_event_t::key: {
        auto key = parsed.get<std::string>();
        FERRY_FORMAT_EXPECT(keys.back().insert(key).second, label, ": key \"", key,
                            "\" appears twice in one object");
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), on_event);
  } catch (const Json::exception& e) {
    fail<FormatError>(label, ": not valid JSON: ", e.what());
  }
}

std::string describe_json(const nlohmann::json& value) {
  if (value.is_array()) return "an array of " + std::to_string(value.size());
  if (value.is_object()) return "an object";
  return value.dump();
}

}  // namespace ferry::detail
