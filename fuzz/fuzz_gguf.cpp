// libFuzzer target for the GGUF header parser: any input must either parse into a header that
// keeps the parser's promises or be refused with a FormatError. Anything else (another exception
// type, a crash, a sanitizer report, a huge allocation) is a bug.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "ferry/error.hpp"
#include "ferry/ggml_type.hpp"
#include "ferry/gguf.hpp"

namespace {

// What an accepted header guarantees to the planner, which trusts it without checking again.
void check_invariants(const ferry::GgufHeader& header, std::uint64_t file_size) {
  if (header.version != 2 && header.version != 3) __builtin_trap();
  if (header.alignment == 0 || (header.alignment & (header.alignment - 1)) != 0) __builtin_trap();
  if (header.data_start % header.alignment != 0) __builtin_trap();
  std::uint64_t previous_end = header.data_start;
  for (const auto& t : header.tensors) {
    if (t.name.empty() || t.file_index != 0 || t.ggml_dims.size() > ferry::kGgufMaxDims)
      __builtin_trap();
    const ferry::GgmlTypeTraits* traits =
        ferry::find_ggml_type(static_cast<std::uint32_t>(t.ggml_type));
    if (traits == nullptr) __builtin_trap();
    // The shape describes exactly the bytes: its product is the size.
    const auto size = ferry::tensor_byte_size(t.dtype, t.shape);
    if (!size || *size != t.size || t.shape.size() != t.ggml_dims.size()) __builtin_trap();
    // Sorted, disjoint, aligned and inside the data section.
    if ((t.offset - header.data_start) % header.alignment != 0) __builtin_trap();
    if (t.offset < previous_end || t.offset > file_size || t.size > file_size - t.offset)
      __builtin_trap();
    previous_end = t.offset + t.size;
  }
  // Every value renders; the JSON is built the same way the CLI parses it back.
  for (const auto& kv : header.metadata) (void)ferry::gguf_value_text(kv.value);
  (void)ferry::gguf_metadata_json(header.metadata);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> input(reinterpret_cast<const std::byte*>(data), size);
  try {
    check_invariants(ferry::parse_gguf_header(input, size, "fuzz-input"), size);
  } catch (const ferry::FormatError&) {
    // The expected way to refuse an input.
  }
  return 0;
}
