// XXH3-64 digests of tensors as they landed in destination memory (read back from the GPU), so
// any load can be checked against any other reader of the same file.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "ferry/loaded_checkpoint.hpp"

namespace ferry {

std::uint64_t tensor_digest(const LoadedCheckpoint& loaded, const LoadedTensor& tensor);

// The digest of `size` bytes at `data` on `device` (read back in pieces from a GPU).
std::uint64_t memory_digest(const Device& device, const void* data, std::uint64_t size);

// The same digest of bytes in host memory.
std::uint64_t bytes_digest(std::span<const std::byte> bytes);

// 16 lowercase hex digits, as xxhsum prints XXH3-64.
std::string digest_hex(std::uint64_t digest);

}  // namespace ferry
