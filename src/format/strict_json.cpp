#include "format/strict_json.hpp"

#include <string>
#include <unordered_set>
#include <vector>

#include "ferry/error.hpp"

namespace ferry::detail {
namespace {

using Json = nlohmann::json;

// Builds the DOM from nlohmann's SAX events, refusing repeated keys and deep nesting as it goes.
// (nlohmann's own callback parser rescans the enclosing object each time an object ends, which
// made a header of n tensors cost O(n^2): 80,000 tensors ran for minutes.)
// With `on_member`, the root must be an object and each of its members is handed over as soon
// as its value is complete, never kept: a header of 100,000 tensors then needs no DOM of 100,000
// members (whose insertion and final release dominated the parse).
class StrictDomBuilder {
 public:
  StrictDomBuilder(Json& root, std::string_view label, int max_depth,
                   const MemberHandler* on_member = nullptr)
      : _root(root), _label(label), _max_depth(max_depth), _on_member(on_member) {}

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
    // Every earlier key of this object already holds its value (placed when it began); the
    // root's members are not kept in member mode, so their keys are.
    const bool repeated = streaming_members() && _open.size() == 1 ? !_root_keys.insert(key).second
                                                                   : _open.back()->contains(key);
    FERRY_FORMAT_EXPECT(!repeated, _label, ": key \"", key, "\" appears twice in one object");
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
      FERRY_FORMAT_EXPECT(!streaming_members() || value.is_object(), _label,
                          ": JSON is not an object");
      _root = std::move(value);
      return &_root;
    }
    if (streaming_members() && _open.size() == 1) {
      _member_key = std::move(_pending_key);
      _member = std::move(value);
      return &_member;
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
    if (streaming_members() && _open.size() == 1) hand_over_member();
    return true;
  }
  void close() {
    _open.pop_back();
    if (streaming_members() && _open.size() == 1) hand_over_member();
  }
  bool streaming_members() const { return _on_member != nullptr; }
  void hand_over_member() { (*_on_member)(std::move(_member_key), std::move(_member)); }
  void open(Json&& container) {
    FERRY_FORMAT_EXPECT(static_cast<int>(_open.size()) < _max_depth, _label,
                        ": JSON nests deeper than ", _max_depth, " levels");
    _open.push_back(place(std::move(container)));
  }

  Json& _root;
  std::string_view _label;
  int _max_depth;
  const MemberHandler* _on_member;
  std::vector<Json*> _open;  // containers not yet closed, innermost last
  std::string _pending_key;
  std::unordered_set<std::string> _root_keys;  // member mode: the root's keys so far
  std::string _member_key;                     // member mode: the root member being built
  Json _member;
};

}  // namespace

nlohmann::json parse_strict_json(std::string_view text, std::string_view label, int max_depth) {
  Json root;
  StrictDomBuilder builder(root, label, max_depth);
  Json::sax_parse(text.begin(), text.end(), &builder);
  return root;
}

void parse_strict_json_members(std::string_view text, std::string_view label, int max_depth,
                               const MemberHandler& on_member) {
  Json root;
  StrictDomBuilder builder(root, label, max_depth, &on_member);
  Json::sax_parse(text.begin(), text.end(), &builder);
}

std::string describe_json(const nlohmann::json& value) {
  if (value.is_array()) return "an array of " + std::to_string(value.size());
  if (value.is_object()) return "an object";
  return value.dump();
}

}  // namespace ferry::detail
