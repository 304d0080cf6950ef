#include "ferry/safetensors_writer.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "ferry/error.hpp"
#include "platform/file_descriptor.hpp"

namespace ferry {
namespace {

// safetensors' Dtype enum in declaration order: its writer sorts by this, largest first.
int safetensors_rank(DType dtype) {
  switch (dtype) {
    case DType::Bool:
      return 0;
    case DType::F4:
      return 1;
    case DType::F6_E2M3:
      return 2;
    case DType::F6_E3M2:
      return 3;
    case DType::U8:
      return 4;
    case DType::I8:
      return 5;
    case DType::F8_E5M2:
      return 6;
    case DType::F8_E4M3:
      return 7;
    case DType::F8_E8M0:
      return 8;
    case DType::F8_E4M3FNUZ:
      return 9;
    case DType::F8_E5M2FNUZ:
      return 10;
    case DType::I16:
      return 11;
    case DType::U16:
      return 12;
    case DType::F16:
      return 13;
    case DType::BF16:
      return 14;
    case DType::I32:
      return 15;
    case DType::U32:
      return 16;
    case DType::F32:
      return 17;
    case DType::C64:
      return 18;
    case DType::F64:
      return 19;
    case DType::I64:
      return 20;
    case DType::U64:
      return 21;
  }
  return -1;
}

}  // namespace

std::vector<std::size_t> safetensors_write_order(std::span<const TensorSpec> tensors) {
  std::vector<std::size_t> order(tensors.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const int ra = safetensors_rank(tensors[a].dtype), rb = safetensors_rank(tensors[b].dtype);
    if (ra != rb) return ra > rb;
    return tensors[a].name < tensors[b].name;  // std::string compares bytes, as Rust's str
  });
  return order;
}

EncodedSafetensorsHeader encode_safetensors_header(
    std::span<const TensorSpec> tensors, const std::optional<SafetensorsMetadata>& metadata) {
  // serde_json and nlohmann agree on compact output: no spaces, UTF-8 kept, the same escapes.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (metadata) {
    nlohmann::ordered_json pairs = nlohmann::ordered_json::object();
    for (const auto& [key, value] : *metadata) pairs[key] = value;
    header["__metadata__"] = std::move(pairs);
  }
  EncodedSafetensorsHeader out;
  out.layout.reserve(tensors.size());
  std::unordered_set<std::string_view> names;
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    FERRY_EXPECT(t.name != "__metadata__", std::invalid_argument,
                 "a tensor may not be named \"__metadata__\" (the header's metadata key)");
    FERRY_EXPECT(names.insert(t.name).second, std::invalid_argument, "tensor \"", t.name,
                 "\" is given twice");
    const auto bytes = tensor_byte_size(t.dtype, t.shape);
    FERRY_EXPECT(bytes.has_value(), std::invalid_argument, "tensor \"", t.name, "\" (",
                 dtype_name(t.dtype), ") has no whole-byte size in 64 bits");
    header[t.name] = {{"dtype", dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + *bytes}}};
    out.layout.push_back({t.name, t.dtype, t.shape, 0, offset, *bytes});
    offset += *bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::uint64_t data_start = 8 + text.size();
  for (auto& info : out.layout) info.offset += data_start;
  out.file_size = data_start + offset;
  out.bytes.resize(8);
  for (int i = 0; i < 8; ++i) out.bytes[i] = static_cast<char>(text.size() >> (8 * i));
  out.bytes += text;
  return out;
}

std::vector<TensorInfo> write_safetensors(
    const std::filesystem::path& path, std::span<const TensorSpec> tensors,
    const std::function<void(const TensorSpec&, std::span<std::byte>)>& fill,
    const std::map<std::string, std::string>& metadata) {
  std::optional<SafetensorsMetadata> pairs;
  if (!metadata.empty()) pairs = SafetensorsMetadata(metadata.begin(), metadata.end());
  EncodedSafetensorsHeader header;
  try {
    header = encode_safetensors_header(tensors, pairs);
  } catch (const std::invalid_argument& e) {
    detail::fail<std::invalid_argument>(path.string(), ": ", e.what());
  }
  const detail::FileDescriptor fd = detail::create_for_writing(path);
  detail::write_exact(fd, header.bytes.data(), header.bytes.size(), 0, path);
  std::uint64_t offset = header.bytes.size();
  std::vector<std::byte> buffer;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    buffer.resize(header.layout[i].size);
    fill(tensors[i], buffer);
    detail::write_exact(fd, buffer.data(), buffer.size(), offset, path);
    offset += buffer.size();
  }
  return header.layout;
}

}  // namespace ferry
