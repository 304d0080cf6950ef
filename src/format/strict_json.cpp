#include "format/strict_json.hpp"

#include <string>
#include <vector>

#include "ferry/error.hpp"

namespace ferry::detail {
namespace {

using Json = nlohmann::json;

// Builds the DOM from nlohmann's SAX events, refusing repeated keys and deep nesting as it goes.
// (nlohmann's own callback parser rescans the enclosing object each time an object ends, which
// made a JSON object of n members cost O(n^2): 80,000 ran for minutes.)
class StrictDomBuilder {
 public:
  StrictDomBuilder(Json& root, std::string_view label, int max_depth)
      : _root(root), _label(label), _max_depth(max_depth) {}

  bool null() { return add(nullptr); }
  bool boolean(bool value) { return add(value); }
  bool number_integer(Json::number_integer_t value) { return add(value); }
  bool number_unsigned(Json::number_unsigned_t value) { return add(value); }
  bool number_float(Json::number_float_t value, const std::string&) { return add(value); }
  bool string(Json::string_t& value) { return add(std::move(value)); }
  bool binary(Json::binary_t& value) { return add(Json::binary(std::move(value))); }

  bool start_object(std::size_t) {
    open(Json::object());
    return true;
  }
  bool key(Json::string_t& key) {
    // Every earlier key of this object already holds its value (placed when it began).
    FERRY_FORMAT_EXPECT(!_open.back()->contains(key), _label, ": key \"", key,
                        "\" appears twice in one object");
    _pending_key = std::move(key);
    return true;
  }
  bool end_object() {
    close();
    return true;
  }
  bool start_array(std::size_t) {
    open(Json::array());
    return true;
  }
  bool end_array() {
    close();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::json::exception& e) {
    fail<FormatError>(_label, ": not valid JSON: ", e.what());
  }

 private:
  // Places `value` in the innermost open container (or at the root); returns where it lives.
  // Values of objects (std::map) never move; an array only grows while it is innermost, when
  // no pointer into it is held.
  Json* place(Json&& value) {
    if (_open.empty()) {
      _root = std::move(value);
      return &_root;
    }
    Json& parent = *_open.back();
    if (parent.is_array()) {
      parent.push_back(std::move(value));
      return &parent.back();
    }
    auto& object = parent.get_ref<Json::object_t&>();
    return &object.emplace(std::move(_pending_key), std::move(value)).first->second;
  }
  template <class T>
  bool add(T&& value) {
    place(Json(std::forward<T>(value)));
    return true;
  }
  void close() { _open.pop_back(); }
  void open(Json&& container) {
    FERRY_FORMAT_EXPECT(static_cast<int>(_open.size()) < _max_depth, _label,
                        ": JSON nests deeper than ", _max_depth, " levels");
    _open.push_back(place(std::move(container)));
  }

  Json& _root;
  std::string_view _label;
  int _max_depth;
  std::vector<Json*> _open;  // containers not yet closed, innermost last
  std::string _pending_key;
};

}  // namespace

nlohmann::json parse_strict_json(std::string_view text, std::string_view label, int max_depth) {
  Json root;
  StrictDomBuilder builder(root, label, max_depth);
  Json::sax_parse(text.begin(), text.end(), &builder);
  return root;
}

std::string describe_json(const nlohmann::json& value) {
  if (value.is_array()) return "an array of " + std::to_string(value.size());
  if (value.is_object()) return "an object";
  return value.dump();
}

}  // namespace ferry::detail
