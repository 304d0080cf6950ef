// libFuzzer target for the safetensors header parser: any input must either parse into a header
// that keeps the parser's promises or be refused with a FormatError. Anything else (another
// exception type, a crash, a sanitizer report) is a bug.
#include <cstddef>
#include <cstdint>
#include <span>

#include "ferry/dtype.hpp"
#include "ferry/error.hpp"
#include "ferry/safetensors.hpp"

namespace {

// What an accepted header guarantees to the planner, which trusts it without checking again.
void check_invariants(const ferry::SafetensorsHeader& header, std::uint64_t file_size) {
  if (header.data_start < 8 || header.data_start > file_size) __builtin_trap();
  std::uint64_t previous_end = header.data_start;
  for (const auto& t : header.tensors) {
    if (t.name.empty() || t.file_index != 0) __builtin_trap();
    const auto size = ferry::tensor_byte_size(t.dtype, t.shape);
    if (!size || *size != t.size) __builtin_trap();
    // Sorted, disjoint and inside the data section.
    if (t.offset < previous_end || t.offset > file_size || t.size > file_size - t.offset)
      __builtin_trap();
    previous_end = t.offset + t.size;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> input(reinterpret_cast<const std::byte*>(data), size);
  try {
    check_invariants(ferry::parse_safetensors_header(input, size, "fuzz-input"), size);
  } catch (const ferry::FormatError&) {
    // The expected way to refuse an input.
  }
  return 0;
}
