#include "ferry/gguf.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <unordered_set>

#include "ferry/error.hpp"
#include "format/tensor_layout.hpp"
#include "ferry/ggml_type.hpp"
#include "platform/file_descriptor.hpp"

namespace ferry {
namespace {

constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};

// Smallest encodings, for refusing counts before anything is reserved for them.
constexpr std::uint64_t kMinKeyValueBytes = 8 + 4 + 1;        // empty key, type, UINT8
constexpr std::uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;  // empty name, n_dims 0, type, offset
constexpr std::uint64_t kStringLengthBytes = 8;
constexpr std::uint64_t kArrayHeadBytes = 4 + 8;  // element type, count

// Values decoded one object each (elements of arrays of arrays) cost ~100 bytes of memory for
// 12 bytes of file; this bounds that growth. ggml itself reads no nested arrays at all.
constexpr std::uint64_t kMaxNestedValues = 1u << 20;

// Strings in arrays cost 32 bytes each (a std::string) for as few as 8 bytes of file. Real
// tokenizers hold some 100,000s (tokens and merges); this bounds what a header of empty strings
// could cost.
constexpr std::uint64_t kMaxArrayStrings = 1u << 22;

std::uint64_t load_le(std::span<const std::byte> bytes) {
  std::uint64_t value = 0;
  for (std::size_t i = bytes.size(); i-- > 0;)
    value = (value << 8) | std::to_integer<std::uint64_t>(bytes[i]);
  return value;
}

// A cursor over the header. Every read checks the bytes it needs against the end of the file
// (and kGgufMaxHeaderBytes) first, so a count or length that lies is refused before anything is
// allocated for it; only then are the bytes fetched, from memory or from the file.
class HeaderReader {
 public:
  // Makes bytes [0, end) available and returns all bytes available so far.
  using Fetch = std::function<std::span<const std::byte>(std::uint64_t end)>;

  HeaderReader(std::span<const std::byte> bytes, std::uint64_t file_size, std::string_view label,
               Fetch fetch)
      : _bytes(bytes),
        _file_size(file_size),
        _limit(std::min(file_size, kGgufMaxHeaderBytes)),
        _label(label),
        _fetch(std::move(fetch)) {}

  std::string_view label() const { return _label; }
  std::uint64_t pos() const { return _pos; }
  std::uint64_t file_size() const { return _file_size; }

  std::span<const std::byte> take(std::uint64_t n, std::string_view context,
                                  std::string_view what) {
    if (n > _limit - _pos)
      detail::fail<FormatError>(_label, ": ", context, what, " (", n, " bytes at offset ", _pos,
                                ") runs past ", end_text());
    if (_pos + n > _bytes.size()) _bytes = _fetch(_pos + n);
    auto out = _bytes.subspan(_pos, n);
    _pos += n;
    return out;
  }

  std::uint64_t uint(std::size_t width, std::string_view context, std::string_view what) {
    return load_le(take(width, context, what));
  }

  std::string string(std::string_view context, std::string_view what) {
    const std::uint64_t length = uint(kStringLengthBytes, context, what);
    const auto bytes = take(length, context, what);
    return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }

  // Refuses `count` items of at least `min_bytes` each where they cannot fit in what is left.
  void expect_fits(std::uint64_t count, std::uint64_t min_bytes, std::string_view context,
                   std::string_view what) {
    FERRY_FORMAT_EXPECT(count <= (_limit - _pos) / min_bytes, _label, ": ", context, what, " ",
                        count, " cannot fit: each takes at least ", min_bytes, " bytes and only ",
                        _limit - _pos, " remain before ", end_text());
  }

  // Counts strings in arrays against kMaxArrayStrings.
  void count_strings(std::uint64_t count, std::string_view context) {
    FERRY_FORMAT_EXPECT(count <= _strings_left, _label, ": ", context,
                        "arrays hold more than ", kMaxArrayStrings, " strings in all");
    _strings_left -= count;
  }

  // Counts values decoded one object each against kMaxNestedValues.
  void count_nested(std::uint64_t count, std::string_view context) {
    FERRY_FORMAT_EXPECT(count <= _nested_left, _label, ": ", context,
                        "arrays of arrays hold more than ", kMaxNestedValues, " arrays in all");
    _nested_left -= count;
  }

 private:
  std::string end_text() const {
    if (_limit < _file_size)
      return detail::concat("the ", kGgufMaxHeaderBytes, "-byte limit on GGUF headers");
    return detail::concat("the end of the ", _file_size, "-byte file");
  }

  std::span<const std::byte> _bytes;
  std::uint64_t _file_size;
  std::uint64_t _limit;
  std::uint64_t _pos = 0;
  std::uint64_t _nested_left = kMaxNestedValues;
  std::uint64_t _strings_left = kMaxArrayStrings;
  std::string_view _label;
  Fetch _fetch;
};

GgufValueType read_value_type(HeaderReader& r, const std::string& context, std::string_view what) {
  const std::uint64_t at = r.pos();
  const auto raw = static_cast<std::uint32_t>(r.uint(4, context, what));
  FERRY_FORMAT_EXPECT(raw < kGgufValueTypeCount, r.label(), ": ", context, "unknown ", what, " ",
                      raw, " at offset ", at);
  return static_cast<GgufValueType>(raw);
}

// `depth`: the arrays around the value (0 for a key's own value).
GgufValue read_value(HeaderReader& r, GgufValueType type, int depth, const std::string& context);

// The body of an ARRAY value (element type, count, elements) at nesting level `depth` (1 for a
// key's own array).
GgufArray read_array(HeaderReader& r, int depth, const std::string& context) {
  FERRY_FORMAT_EXPECT(depth <= kGgufMaxArrayDepth, r.label(), ": ", context,
                      "arrays nest deeper than ", kGgufMaxArrayDepth, " levels");
  GgufArray array;
  array.element_type = read_value_type(r, context, "array element type");
  array.size = r.uint(8, context, "array length");
  const std::size_t fixed = gguf_value_size(array.element_type);
  if (fixed > 0) {
    r.expect_fits(array.size, fixed, context, "array length");
    const auto bytes = r.take(array.size * fixed, context, "array elements");
    if (array.element_type == GgufValueType::Bool)
      for (std::size_t i = 0; i < bytes.size(); ++i)
        FERRY_FORMAT_EXPECT(std::to_integer<unsigned>(bytes[i]) <= 1, r.label(), ": ", context,
                            "BOOL array element ", i, " is ", std::to_integer<unsigned>(bytes[i]),
                            ", not 0 or 1");
    array.fixed.assign(bytes.begin(), bytes.end());
  } else if (array.element_type == GgufValueType::String) {
    r.expect_fits(array.size, kStringLengthBytes, context, "array length");
    r.count_strings(array.size, context);
    array.strings.reserve(array.size);
    for (std::uint64_t i = 0; i < array.size; ++i)
      array.strings.push_back(r.string(context, "string in array"));
  } else {
    r.expect_fits(array.size, kArrayHeadBytes, context, "array length");
    r.count_nested(array.size, context);
    array.arrays.reserve(array.size);
    for (std::uint64_t i = 0; i < array.size; ++i)
      array.arrays.push_back(read_value(r, GgufValueType::Array, depth, context));
  }
  return array;
}

GgufValue read_value(HeaderReader& r, GgufValueType type, int depth, const std::string& context) {
  GgufValue value;
  value.type = type;
  const std::uint64_t at = r.pos();
  switch (type) {
    case GgufValueType::Uint8:
    case GgufValueType::Uint16:
    case GgufValueType::Uint32:
    case GgufValueType::Uint64:
      value.value = r.uint(gguf_value_size(type), context, "value");
      break;
    case GgufValueType::Int8:
    case GgufValueType::Int16:
    case GgufValueType::Int32:
    case GgufValueType::Int64:
    case GgufValueType::Float32:
    case GgufValueType::Float64: {
      // Decoded like an array element so that there is one place for sign and float bits.
      GgufArray one{type, 1, {}, {}, {}};
      const auto bytes = r.take(gguf_value_size(type), context, "value");
      one.fixed.assign(bytes.begin(), bytes.end());
      return gguf_array_element(one, 0);
    }
    case GgufValueType::Bool: {
      const auto raw = r.uint(1, context, "value");
      FERRY_FORMAT_EXPECT(raw <= 1, r.label(), ": ", context, "BOOL value at offset ", at, " is ",
                          raw, ", not 0 or 1");
      value.value = raw == 1;
      break;
    }
    case GgufValueType::String:
      value.value = r.string(context, "string");
      break;
    case GgufValueType::Array:
      value.value = read_array(r, depth + 1, context);
      break;
  }
  return value;
}

std::uint64_t read_alignment(const std::vector<GgufKeyValue>& metadata, std::string_view label) {
  for (const auto& kv : metadata) {
    if (kv.key != "general.alignment") continue;
    FERRY_FORMAT_EXPECT(kv.value.type == GgufValueType::Uint32, label,
                        ": key \"general.alignment\" must be a UINT32, not ",
                        gguf_value_type_name(kv.value.type));
    const std::uint64_t alignment = std::get<std::uint64_t>(kv.value.value);
    FERRY_FORMAT_EXPECT(alignment != 0 && (alignment & (alignment - 1)) == 0, label,
                        ": key \"general.alignment\" is ", alignment,
                        ", not a nonzero power of two");
    return alignment;
  }
  return kGgufDefaultAlignment;
}

std::string dims_text(const std::vector<std::uint64_t>& dims) {
  std::string out = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + "]";
}

// Fills dtype, shape and size from ggml_type and ggml_dims; see GgufHeader::tensors.
void describe_bytes(TensorInfo& info, const GgmlTypeTraits& traits, std::string_view label) {
  const auto& dims = info.ggml_dims;
  const std::string context = detail::concat(label, ": tensor \"", info.name, "\": ");
  // ggml holds dims and element counts as int64_t. The product of the nonzero dims bounds every
  // partial product, in whichever order a consumer of `shape` multiplies them.
  constexpr std::uint64_t kMaxCount = std::numeric_limits<std::int64_t>::max();
  std::uint64_t nonzero = 1;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    FERRY_FORMAT_EXPECT(dims[i] <= kMaxCount, context, "dimension ", i, " is ", dims[i],
                        ", more than 2^63 - 1");
    if (dims[i] == 0) continue;
    FERRY_FORMAT_EXPECT(nonzero <= kMaxCount / dims[i], context, "dimensions ", dims_text(dims),
                        " hold more than 2^63 - 1 elements");
    nonzero *= dims[i];
  }
  const bool empty = std::find(dims.begin(), dims.end(), 0) != dims.end();
  const std::uint64_t ne0 = dims.empty() ? 1 : dims[0];
  FERRY_FORMAT_EXPECT(ne0 % traits.block_size == 0, context, "ne[0] = ", ne0, " of ", traits.name,
                      " is not a multiple of its block size ", traits.block_size);
  const auto row_bytes = ggml_row_bytes(traits, ne0);
  const std::uint64_t rows = empty ? 0 : nonzero / ne0;
  FERRY_FORMAT_EXPECT(row_bytes && (rows == 0 || *row_bytes <= UINT64_MAX / rows), context,
                      "dimensions ", dims_text(dims), " of ", traits.name,
                      " take more than 2^64 bytes");
  info.size = *row_bytes * rows;
  info.shape.assign(dims.rbegin(), dims.rend());
  if (traits.dtype) {
    info.dtype = *traits.dtype;
  } else {
    info.dtype = DType::U8;
    info.shape.back() = *row_bytes;  // dims is not empty: ne[0] = 1 is a multiple of no block
  }
  // As with safetensors, dtype and shape alone give the size (tensor_byte_size counts bits, so
  // this refuses plain tensors of 2^61 bytes and more, which no file holds).
  FERRY_FORMAT_EXPECT(tensor_byte_size(info.dtype, info.shape) == info.size, context, "dimensions ",
                      dims_text(dims), " of ", traits.name, " are too large to describe");
}

TensorInfo read_tensor_info(HeaderReader& r, std::uint64_t index, std::uint64_t count,
                            std::uint64_t alignment) {
  const std::string where = detail::concat("tensor ", index, " of ", count, ": ");
  TensorInfo info;
  info.name = r.string(where, "name");
  FERRY_FORMAT_EXPECT(!info.name.empty(), r.label(), ": ", where, "empty name");
  const std::string context = "tensor \"" + info.name + "\": ";
  const auto n_dims = static_cast<std::uint32_t>(r.uint(4, context, "n_dims"));
  FERRY_FORMAT_EXPECT(n_dims <= kGgufMaxDims, r.label(), ": ", context, "n_dims is ", n_dims,
                      ", more than ", kGgufMaxDims);
  for (std::uint32_t i = 0; i < n_dims; ++i) info.ggml_dims.push_back(r.uint(8, context, "dims"));
  const auto type_id = static_cast<std::uint32_t>(r.uint(4, context, "ggml type"));
  const GgmlTypeTraits* traits = find_ggml_type(type_id);
  FERRY_FORMAT_EXPECT(traits != nullptr, r.label(), ": ", context, "unknown ggml type ", type_id);
  info.ggml_type = static_cast<std::int32_t>(type_id);
  info.offset = r.uint(8, context, "offset");
  FERRY_FORMAT_EXPECT(info.offset % alignment == 0, r.label(), ": ", context, "offset ",
                      info.offset, " is not a multiple of the alignment ", alignment);
  describe_bytes(info, *traits, r.label());
  return info;
}

std::string hex_bytes(std::span<const std::byte> bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (std::byte b : bytes) {
    const auto v = std::to_integer<unsigned>(b);
    out += (out.empty() ? "" : " ") + std::string{kHex[v >> 4], kHex[v & 15]};
  }
  return out;
}

void check_version(std::uint32_t version, std::string_view label) {
  if (version == 2 || version == 3) return;
  FERRY_FORMAT_EXPECT(version != 0x02000000 && version != 0x03000000, label,
                      ": a big-endian GGUF file (version field reads ", version,
                      "); ferry reads little-endian files only");
  FERRY_FORMAT_EXPECT(version != 1, label,
                      ": GGUF version 1 is not supported (ferry reads versions 2 and 3)");
  detail::fail<FormatError>(label, ": unknown GGUF version ", version,
                            " (ferry reads versions 2 and 3)");
}

GgufHeader parse(HeaderReader& r) {
  const std::string_view label = r.label();
  FERRY_FORMAT_EXPECT(r.file_size() >= sizeof kMagic, label, ": file is ", r.file_size(),
                      " bytes, too short for a GGUF header");
  const auto magic = r.take(sizeof kMagic, "", "magic");
  FERRY_FORMAT_EXPECT(std::memcmp(magic.data(), kMagic, sizeof kMagic) == 0, label,
                      ": not a GGUF file (bad magic: it starts with bytes ", hex_bytes(magic),
                      ", not \"GGUF\")");
  GgufHeader header;
  header.version = static_cast<std::uint32_t>(r.uint(4, "", "version"));
  check_version(header.version, label);
  const std::uint64_t tensor_count = r.uint(8, "", "tensor count");
  const std::uint64_t kv_count = r.uint(8, "", "key-value count");
  r.expect_fits(kv_count, kMinKeyValueBytes, "", "key-value count");
  r.expect_fits(tensor_count, kMinTensorInfoBytes, "", "tensor count");
  FERRY_FORMAT_EXPECT(kv_count <= kGgufMaxKeyValues, label, ": key-value count ", kv_count,
                      " is more than ferry reads (", kGgufMaxKeyValues, ")");
  FERRY_FORMAT_EXPECT(tensor_count <= kGgufMaxTensors, label, ": tensor count ", tensor_count,
                      " is more than ferry reads (", kGgufMaxTensors, ")");

  // Views of the keys in header.metadata, which is reserved and so never moves them.
  std::unordered_set<std::string_view> keys;
  keys.reserve(kv_count);
  header.metadata.reserve(kv_count);
  for (std::uint64_t i = 0; i < kv_count; ++i) {
    GgufKeyValue& kv = header.metadata.emplace_back();
    kv.key = r.string(detail::concat("key-value pair ", i, " of ", kv_count, ": "), "key");
    const std::string context = "key \"" + kv.key + "\": ";
    FERRY_FORMAT_EXPECT(!kv.key.empty(), label, ": key-value pair ", i, " has an empty key");
    FERRY_FORMAT_EXPECT(keys.insert(kv.key).second, label, ": ", context, "appears twice");
    const GgufValueType type = read_value_type(r, context, "value type");
    kv.value = read_value(r, type, 0, context);
  }
  header.alignment = read_alignment(header.metadata, label);

  // Checked again now that the metadata has used its share of the bytes.
  r.expect_fits(tensor_count, kMinTensorInfoBytes, "", "tensor count");
  // Views of the names in header.tensors, which is reserved and so never moves them.
  std::unordered_set<std::string_view> names;
  names.reserve(tensor_count);
  header.tensors.reserve(tensor_count);
  for (std::uint64_t i = 0; i < tensor_count; ++i) {
    header.tensors.push_back(read_tensor_info(r, i, tensor_count, header.alignment));
    const std::string& name = header.tensors.back().name;
    FERRY_FORMAT_EXPECT(names.insert(name).second, label, ": tensor \"", name, "\" appears twice");
  }

  // r.pos() <= kGgufMaxHeaderBytes and alignment < 2^32: no overflow.
  header.data_start = (r.pos() + header.alignment - 1) / header.alignment * header.alignment;
  // Even a tensor of no bytes has its offset inside the file.
  FERRY_FORMAT_EXPECT(header.tensors.empty() || header.data_start <= r.file_size(), label,
                      ": the data section starts at ", header.data_start, ", past the end of the ",
                      r.file_size(), "-byte file");
  const std::uint64_t data_bytes = r.file_size() - std::min(header.data_start, r.file_size());
  for (const auto& t : header.tensors)
    FERRY_FORMAT_EXPECT(t.offset <= data_bytes && t.size <= data_bytes - t.offset, label,
                        ": tensor \"", t.name, "\": ", t.size, " bytes at offset ", t.offset,
                        " run past the ", data_bytes, " data bytes of the file (data starts at ",
                        header.data_start, ")");
  detail::finish_tensor_layout(header.tensors, header.data_start, label);
  return header;
}

}  // namespace

bool has_gguf_magic(std::span<const std::byte> prefix) noexcept {
  return prefix.size() >= sizeof kMagic && std::memcmp(prefix.data(), kMagic, sizeof kMagic) == 0;
}

bool is_gguf_file(const std::filesystem::path& path) {
  auto fd = detail::open_for_reading(path);
  std::byte magic[sizeof kMagic];
  const std::size_t got = detail::read_up_to(fd, magic, sizeof magic, 0, path);
  return has_gguf_magic(std::span(magic, got));
}

GgufHeader parse_gguf_header(std::span<const std::byte> prefix, std::uint64_t file_size,
                             std::string_view label) {
  if (prefix.size() > file_size) prefix = prefix.first(file_size);
  HeaderReader reader(
      prefix, file_size, label, [&](std::uint64_t end) -> std::span<const std::byte> {
        detail::fail<FormatError>(label, ": the header needs ", end, " bytes but only the first ",
                                  prefix.size(), " bytes of the file were given");
      });
  return parse(reader);
}

GgufHeader read_gguf_header(const std::filesystem::path& path) {
  // The first read usually holds all of a small header; tokenizers make headers of some MB,
  // which then take a handful of doubling reads.
  constexpr std::uint64_t kFirstRead = 1u << 20;
  auto fd = detail::open_for_reading(path);
  const std::uint64_t size = detail::file_size(fd, path);
  const std::string label = path.string();
  std::vector<std::byte> buffer;
  HeaderReader reader({}, size, label, [&](std::uint64_t end) -> std::span<const std::byte> {
    // The reader checked `end` against the file size and the header limit.
    const std::uint64_t cap = std::min(size, kGgufMaxHeaderBytes);
    const std::uint64_t want = std::min(cap, std::max({end, 2 * buffer.size(), kFirstRead}));
    const std::size_t old = buffer.size();
    buffer.resize(want);
    detail::read_exact(fd, buffer.data() + old, want - old, old, path);
    return buffer;
  });
  return parse(reader);
}

}  // namespace ferry
