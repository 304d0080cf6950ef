#include "ferry/safetensors.hpp"

#include <algorithm>
#include <cstring>

#include "ferry/error.hpp"
#include "format/safetensors_json.hpp"
#include "format/tensor_layout.hpp"
#include "platform/file_descriptor.hpp"

namespace ferry {
namespace {

std::uint64_t read_le_u64(std::span<const std::byte> bytes) {
  std::uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | std::to_integer<std::uint64_t>(bytes[i]);
  return value;
}

// A safetensors header nests three levels deep (header, tensor, shape).
constexpr int kMaxHeaderDepth = 8;

// The data section holds the tensors back to back from its first byte, as the format requires
// (so that a file cannot carry a second payload between them); `tensors` are sorted, absolute.
void check_packed(const std::vector<TensorInfo>& tensors, std::uint64_t data_start,
                  std::string_view label) {
  std::uint64_t expected = data_start;
  for (const auto& t : tensors) {
    FERRY_FORMAT_EXPECT(t.offset == expected, label, ": tensor \"", t.name,
                        "\" begins at data byte ", t.offset - data_start,
                        " but the tensor before it ends at ", expected - data_start,
                        ": the data section has a hole, which the safetensors format forbids");
    expected = t.offset + t.size;
  }
}

std::uint64_t data_end(const std::vector<TensorInfo>& tensors, std::uint64_t data_start) {
  return tensors.empty() ? data_start : tensors.back().offset + tensors.back().size;
}

}  // namespace

void check_safetensors_tail(std::span<const std::byte> tail, std::string_view label) {
  FERRY_FORMAT_EXPECT(tail.size() <= kSafetensorsMaxTailBytes, label, ": ", tail.size(),
                      " bytes follow the last tensor; at most ", kSafetensorsMaxTailBytes,
                      " bytes of zero padding may");
  for (std::size_t i = 0; i < tail.size(); ++i)
    FERRY_FORMAT_EXPECT(tail[i] == std::byte{0}, label, ": byte ", i,
                        " after the last tensor is not zero: only zero padding may follow it");
}

SafetensorsHeader parse_safetensors_header(std::span<const std::byte> prefix,
                                           std::uint64_t file_size, std::string_view label) {
  FERRY_FORMAT_EXPECT(file_size >= 8 && prefix.size() >= 8, label, ": file is ", file_size,
                      " bytes, too short for a safetensors header");
  const std::uint64_t header_bytes = read_le_u64(prefix.first(8));
  FERRY_FORMAT_EXPECT(header_bytes <= kSafetensorsMaxHeaderBytes, label, ": header length ",
                      header_bytes, " exceeds the limit of ", kSafetensorsMaxHeaderBytes,
                      " bytes (not a safetensors file?)");
  FERRY_FORMAT_EXPECT(header_bytes <= file_size - 8, label, ": header length ", header_bytes,
                      " runs past the end of the ", file_size, "-byte file");
  FERRY_FORMAT_EXPECT(prefix.size() >= 8 + header_bytes, label, ": file is truncated inside its ",
                      header_bytes, "-byte header");
  FERRY_FORMAT_EXPECT(header_bytes > 0, label, ": header is empty");

  const auto* text = reinterpret_cast<const char*>(prefix.data() + 8);
  // safetensors pads its header with spaces (JSON whitespace); NUL bytes are not JSON, though a
  // lenient parser stops at the first one and would accept whatever follows.
  const void* nul = std::memchr(text, 0, header_bytes);
  FERRY_FORMAT_EXPECT(nul == nullptr, label, ": header holds a NUL byte at offset ",
                      8 + (static_cast<const char*>(nul) - text),
                      " (a header may be padded with spaces only)");
  SafetensorsHeader header;
  header.data_start = 8 + header_bytes;
  const std::uint64_t data_bytes = file_size - header.data_start;
  detail::parse_safetensors_json(std::string_view(text, header_bytes), data_bytes, label,
                                 kMaxHeaderDepth, header);

  detail::finish_tensor_layout(header.tensors, header.data_start, label);
  check_packed(header.tensors, header.data_start, label);
  const std::uint64_t end = data_end(header.tensors, header.data_start);
  const std::uint64_t tail = file_size - end;
  FERRY_FORMAT_EXPECT(tail <= kSafetensorsMaxTailBytes, label, ": ", tail,
                      " bytes follow the last tensor; at most ", kSafetensorsMaxTailBytes,
                      " bytes of zero padding may");
  if (prefix.size() >= file_size) check_safetensors_tail(prefix.subspan(end, tail), label);
  return header;
}

SafetensorsHeader read_safetensors_header(const std::filesystem::path& path) {
  auto fd = detail::open_for_reading(path);
  const std::uint64_t size = detail::file_size(fd, path);
  const std::string label = path.string();
  std::vector<std::byte> prefix(8);
  FERRY_FORMAT_EXPECT(size >= 8, label, ": file is ", size,
                      " bytes, too short for a safetensors header");
  detail::read_exact(fd, prefix.data(), 8, 0, path);
  const std::uint64_t header_bytes = read_le_u64(prefix);
  // Bounds are checked here too so that a huge length is refused before it is allocated.
  if (header_bytes <= kSafetensorsMaxHeaderBytes && header_bytes <= size - 8) {
    prefix.resize(8 + header_bytes);
    detail::read_exact(fd, prefix.data() + 8, header_bytes, 8, path);
  }
  SafetensorsHeader header = parse_safetensors_header(prefix, size, label);
  const std::uint64_t end = data_end(header.tensors, header.data_start);
  std::vector<std::byte> tail(size - end);  // at most kSafetensorsMaxTailBytes, checked above
  if (!tail.empty()) detail::read_exact(fd, tail.data(), tail.size(), end, path);
  check_safetensors_tail(tail, label);
  return header;
}

}  // namespace ferry
