#include "format/safetensors_json.hpp"

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ferry/error.hpp"
#include "format/name_index.hpp"
#include "format/strict_json.hpp"

namespace ferry::detail {
namespace {

using Json = nlohmann::json;

std::map<std::string, std::string> parse_metadata(const Json& value, std::string_view label) {
  FERRY_FORMAT_EXPECT(value.is_object(), label, ": __metadata__ is not an object");
  std::map<std::string, std::string> metadata;
  for (const auto& [key, item] : value.items()) {
    FERRY_FORMAT_EXPECT(item.is_string(), label, ": __metadata__ value of \"", key,
                        "\" is not a string");
    metadata.emplace(key, item.get<std::string>());
  }
  return metadata;
}

std::uint64_t as_u64(const Json& value, std::string_view label, std::string_view tensor,
                     std::string_view field) {
  FERRY_FORMAT_EXPECT(
      value.is_number_unsigned() || (value.is_number_integer() && value.get<std::int64_t>() >= 0),
      label, ": tensor \"", tensor, "\": ", field,
      " holds a value that is not a non-negative integer: ", describe_json(value));
  return value.get<std::uint64_t>();
}

// The validation of one entry given as JSON: the slow path, and the one that words every error.
TensorInfo parse_tensor(const std::string& name, const Json& entry, std::uint64_t data_bytes,
                        std::string_view label) {
  FERRY_FORMAT_EXPECT(!name.empty(), label, ": a tensor has an empty name");
  // Fields other than these three are ignored, as safetensors ignores them.
  FERRY_FORMAT_EXPECT(entry.is_object(), label, ": tensor \"", name, "\" is not an object");
  FERRY_FORMAT_EXPECT(entry.contains("dtype") && entry["dtype"].is_string(), label, ": tensor \"",
                      name, "\": missing or non-string dtype");
  FERRY_FORMAT_EXPECT(entry.contains("shape") && entry["shape"].is_array(), label, ": tensor \"",
                      name, "\": missing or non-array shape");
  FERRY_FORMAT_EXPECT(entry.contains("data_offsets") && entry["data_offsets"].is_array() &&
                          entry["data_offsets"].size() == 2,
                      label, ": tensor \"", name, "\": data_offsets must be [begin, end]");

  TensorInfo info;
  info.name = name;
  auto dtype_text = entry["dtype"].get<std::string>();
  auto dtype = dtype_from_name(dtype_text);
  FERRY_FORMAT_EXPECT(dtype.has_value(), label, ": tensor \"", name, "\": unknown dtype \"",
                      dtype_text, "\"");
  info.dtype = *dtype;

  for (const auto& dim : entry["shape"]) info.shape.push_back(as_u64(dim, label, name, "shape"));
  const auto size = tensor_byte_size(info.dtype, info.shape);
  FERRY_FORMAT_EXPECT(size.has_value(), label, ": tensor \"", name, "\": shape ",
                      entry["shape"].dump(), " of ", dtype_text,
                      " overflows 64 bits or does not fill whole bytes");
  const std::uint64_t expected = *size;

  std::uint64_t begin = as_u64(entry["data_offsets"][0], label, name, "data_offsets");
  std::uint64_t end = as_u64(entry["data_offsets"][1], label, name, "data_offsets");
  FERRY_FORMAT_EXPECT(begin <= end, label, ": tensor \"", name, "\": data_offsets [", begin, ", ",
                      end, "] are reversed");
  FERRY_FORMAT_EXPECT(end <= data_bytes, label, ": tensor \"", name, "\": data_offsets [", begin,
                      ", ", end, "] run past the ", data_bytes, " data bytes of the file");
  FERRY_FORMAT_EXPECT(end - begin == expected, label, ": tensor \"", name, "\": shape ",
                      entry["shape"].dump(), " of ", dtype_text, " needs ", expected,
                      " bytes but data_offsets hold ", end - begin);
  info.offset = begin;  // made absolute by the caller
  info.size = end - begin;
  return info;
}

// The SAX events of nlohmann's parser (strict JSON, UTF-8 checked) turned into the header.
class HeaderReader {
 public:
  HeaderReader(std::uint64_t data_bytes, std::string_view label, int max_depth,
               SafetensorsHeader& out)
      : _data_bytes(data_bytes), _label(label), _max_depth(max_depth), _out(out) {}

  bool null() { return value(Json(nullptr)); }
  bool boolean(bool v) { return value(Json(v)); }
  bool number_integer(Json::number_integer_t v) { return value(Json(v)); }
  bool number_unsigned(Json::number_unsigned_t v) {
    if (!_dom_target && _state == State::FastArray) {
      _numbers.push_back(v);
      return true;
    }
    return value(Json(v));
  }
  bool number_float(Json::number_float_t v, const std::string&) { return value(Json(v)); }
  bool string(Json::string_t& v) {
    if (!_dom_target && _state == State::Field && _field_bit == kDtype) {
      _dtype = v;
      _fast |= kDtype;
      _state = State::Entry;
      return true;
    }
    return value(Json(std::move(v)));
  }
  bool binary(Json::binary_t& v) { return value(Json::binary(std::move(v))); }

  bool start_object(std::size_t) {
    deeper();
    if (!_dom_target && _state == State::FastArray) leave_fast_array();
    if (_dom_target) return dom_open(Json::object());
    switch (_state) {
      case State::Start:
        _state = State::Root;
        return true;
      case State::Member:
        if (_member_key == "__metadata__") break;
        _state = State::Entry;
        _seen = _fast = 0;
        _extra = nullptr;
        return true;
      default:
        break;
    }
    enter_dom();
    return dom_open(Json::object());
  }

  bool start_array(std::size_t) {
    deeper();
    if (!_dom_target && _state == State::FastArray) leave_fast_array();
    if (_dom_target) return dom_open(Json::array());
    if (_state == State::Field && (_field_bit == kShape || _field_bit == kOffsets)) {
      _state = State::FastArray;
      _numbers.clear();
      return true;
    }
    enter_dom();
    return dom_open(Json::array());
  }

  bool key(Json::string_t& k) {
    if (_dom_target) {
      FERRY_FORMAT_EXPECT(!_dom.back()->contains(k), _label, ": key \"", k,
                          "\" appears twice in one object");
      _dom_key = std::move(k);
      return true;
    }
    if (_state == State::Root) {
      if (k == "__metadata__") {
        FERRY_FORMAT_EXPECT(!_metadata_seen, _label, ": key \"", k,
                            "\" appears twice in one object");
        _metadata_seen = true;
      }
      _member_key = k;
      _state = State::Member;
      return true;
    }
    // Inside a tensor entry.
    _field_bit = k == "dtype" ? kDtype : k == "shape" ? kShape : k == "data_offsets" ? kOffsets : 0;
    const bool repeated =
        _field_bit ? (_seen & _field_bit) != 0 : (!_extra.is_null() && _extra.contains(k));
    FERRY_FORMAT_EXPECT(!repeated, _label, ": key \"", k, "\" appears twice in one object");
    _seen |= _field_bit;
    _field_key = std::move(k);
    _state = State::Field;
    return true;
  }

  bool end_object() {
    --_depth;
    if (_dom_target) return dom_close();
    if (_state == State::Entry) {
      finish_entry();
      _state = State::Root;
    } else {  // the root
      _state = State::Done;
    }
    return true;
  }

  bool end_array() {
    --_depth;
    if (_dom_target) return dom_close();
    // The end of a fast array.
    (_field_bit == kShape ? _shape : _offsets) = _numbers;
    _fast |= _field_bit;
    _state = State::Entry;
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::json::exception& e) {
    fail<FormatError>(_label, ": not valid JSON: ", e.what());
  }

 private:
  enum class State { Start, Root, Member, Entry, Field, FastArray, Done };
  static constexpr unsigned kDtype = 1, kShape = 2, kOffsets = 4;

  void deeper() {
    FERRY_FORMAT_EXPECT(++_depth <= _max_depth, _label, ": JSON nests deeper than ", _max_depth,
                        " levels");
  }

  // A value where the fast path does not take it: from here to its end it is built as JSON.
  bool value(Json&& v) {
    if (!_dom_target) {
      if (_state == State::FastArray) {
        leave_fast_array();
      } else {
        enter_dom();
      }
    }
    dom_place(std::move(v));
    if (_dom.empty()) dom_done();
    return true;
  }

  // An array of a field that turns out not to be all unsigned integers: what it held so far
  // becomes JSON, open, and the rest of it is built there.
  void leave_fast_array() {
    Json& target = extra_field();
    target = Json::array();
    for (const auto n : _numbers) target.push_back(n);
    _dom_target = &target;
    _dom_origin = State::Field;
    _dom.push_back(&target);
  }

  Json& extra_field() {
    if (_extra.is_null()) _extra = Json::object();
    return _extra[_field_key];
  }

  void enter_dom() {
    FERRY_FORMAT_EXPECT(_state != State::Start, _label, ": JSON is not an object");
    if (_state == State::Member) {
      _member = nullptr;
      _dom_target = &_member;
    } else {  // a field of an entry
      _dom_target = &extra_field();
    }
    _dom_origin = _state;
  }

  // Places `v` in the innermost open container, or as the value being built.
  Json* dom_place(Json&& v) {
    if (_dom.empty()) {
      *_dom_target = std::move(v);
      return _dom_target;
    }
    Json& parent = *_dom.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    auto& object = parent.get_ref<Json::object_t&>();
    return &object.emplace(std::move(_dom_key), std::move(v)).first->second;
  }
  bool dom_open(Json&& container) {
    _dom.push_back(dom_place(std::move(container)));
    return true;
  }
  bool dom_close() {
    _dom.pop_back();
    if (_dom.empty()) dom_done();
    return true;
  }
  void dom_done() {
    _dom_target = nullptr;
    if (_dom_origin == State::Field) {
      _state = State::Entry;
      return;
    }
    _state = State::Root;
    if (_member_key == "__metadata__") {
      _out.metadata = parse_metadata(_member, _label);
      _out.has_metadata = true;
    } else {
      _out.tensors.push_back(parse_tensor(_member_key, _member, _data_bytes, _label));
    }
  }

  void finish_entry() {
    if (_fast == (kDtype | kShape | kOffsets) && _extra.is_null() && !_member_key.empty() &&
        _offsets.size() == 2) {
      const auto dtype = dtype_from_name(_dtype);
      const auto size = dtype ? tensor_byte_size(*dtype, _shape) : std::nullopt;
      const std::uint64_t begin = _offsets[0], end = _offsets[1];
      if (size && begin <= end && end <= _data_bytes && end - begin == *size) {
        TensorInfo& info = _out.tensors.emplace_back();
        info.name = _member_key;
        info.dtype = *dtype;
        info.shape = _shape;
        info.offset = begin;
        info.size = end - begin;
        return;
      }
    }
    // The entry as JSON: the validation that words the error (or takes the unknown fields).
    Json entry = _extra.is_null() ? Json::object() : std::move(_extra);
    if (_fast & kDtype) entry["dtype"] = _dtype;
    if (_fast & kShape) entry["shape"] = _shape;
    if (_fast & kOffsets) entry["data_offsets"] = _offsets;
    _extra = nullptr;
    _out.tensors.push_back(parse_tensor(_member_key, entry, _data_bytes, _label));
  }

  std::uint64_t _data_bytes;
  std::string_view _label;
  int _max_depth;
  SafetensorsHeader& _out;
  State _state = State::Start;
  int _depth = 0;
  bool _metadata_seen = false;
  std::string _member_key;  // the root member being read
  // A tensor entry: the fields seen, those taken on the fast path, and the rest as JSON.
  unsigned _seen = 0, _fast = 0, _field_bit = 0;
  std::string _field_key, _dtype;
  std::vector<std::uint64_t> _shape, _offsets, _numbers;
  Json _extra;
  // A value built as JSON: where it goes, its open containers, the next key, where it began.
  Json* _dom_target = nullptr;
  std::vector<Json*> _dom;
  std::string _dom_key;
  State _dom_origin = State::Member;
  Json _member;
};

}  // namespace

void parse_safetensors_json(std::string_view text, std::uint64_t data_bytes, std::string_view label,
                            int max_depth, SafetensorsHeader& out) {
  HeaderReader reader(data_bytes, label, max_depth, out);
  Json::sax_parse(text.begin(), text.end(), &reader);
  // Root keys: the names, checked once all are read (one flat table, no set of strings).
  NameIndex index;
  if (const auto repeated = index.build(out.tensors))
    fail<FormatError>(label, ": key \"", out.tensors[repeated->second].name,
                      "\" appears twice in one object");
}

}  // namespace ferry::detail
