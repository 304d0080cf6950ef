// libFuzzer target for the safetensors index parser (model.safetensors.index.json): any input
// must either parse into an index that keeps the parser's promises or be refused with a
// FormatError. Anything else (another exception type, a crash, a sanitizer report) is a bug.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <set>
#include <string_view>

#include "ferry/error.hpp"
#include "format/safetensors_index.hpp"

namespace {

// What Checkpoint::open trusts: shards beside the index, named once, every tensor's shard among
// them, no NUL anywhere (C strings would cut it short).
void check_invariants(const ferry::detail::SafetensorsIndex& index) {
  if (index.shards.empty()) __builtin_trap();
  const std::set<std::string> shards(index.shards.begin(), index.shards.end());
  if (shards.size() != index.shards.size()) __builtin_trap();
  for (const auto& shard : index.shards) {
    const std::filesystem::path path(shard);
    if (shard.empty() || shard.find('\0') != std::string::npos || !path.is_relative())
      __builtin_trap();
    for (const auto& part : path)
      if (part == "..") __builtin_trap();
  }
  for (const auto& [tensor, shard] : index.shard_of_tensor)
    if (tensor.find('\0') != std::string::npos || shard >= index.shards.size()) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    check_invariants(ferry::detail::parse_safetensors_index(text, "fuzz-input"));
  } catch (const ferry::FormatError&) {
    // The expected way to refuse an input.
  }
  return 0;
}
