// Pieces of `ferry load` that `ferry demo` shares.
#pragma once

#include <string>

#include "ferry/device.hpp"
#include "ferry/loaded_checkpoint.hpp"

namespace ferry::cli {

// "auto" picks cuda:0 where a GPU is usable and says on stderr why not otherwise.
Device resolve_device(const std::string& text);

// One line per tensor, sorted by name: name, dtype, shape, XXH3-64 of the loaded bytes (for
// GGUF tensors the ggml type and dims, ne[0] first).
void print_digests(const LoadedCheckpoint& loaded);

}  // namespace ferry::cli
