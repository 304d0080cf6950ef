// Saving tensors that live in memory (host or GPU) as a safetensors file or bytes, identical to
// what Hugging Face's safetensors writes for the same tensors and metadata (see
// safetensors_writer.hpp for the layout and order). Files are written to a temporary name,
// synced and renamed, so the final name never holds a partial file; GPU tensors stream through
// bounded pinned staging (device -> host -> O_DIRECT write), never the whole file in host memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>

#include "ferry/device.hpp"
#include "ferry/safetensors_writer.hpp"

namespace ferry {

struct SaveTensor {
  TensorSpec spec;
  const void* data = nullptr;  // contiguous bytes of exactly the spec's size
  std::uint64_t size = 0;      // the caller's byte count, checked against the spec
  Device device;               // where `data` lives
};

struct SaveOptions {
  bool direct = true;                          // O_DIRECT where the file system allows it
  std::uint64_t staging_bytes = 128ull << 20;  // host staging, all buffers together
  std::uint64_t piece_bytes = 16ull << 20;     // one write
  unsigned writer_threads = 4;
};

struct SaveStats {
  std::uint64_t file_bytes = 0;
  double seconds = 0;
  std::string io_path;    // "direct" or "buffered"
  std::string io_reason;  // why that path
  std::uint64_t staging_bytes = 0;
  bool pinned = false;
  double fill_seconds = 0;   // copying into staging (device -> host or memcpy)
  double wait_seconds = 0;   // waiting for staging (the writes were behind)
  double write_seconds = 0;  // summed over writer threads
};

// Writes `tensors` to `path` in safetensors' order. Throws std::invalid_argument for bad
// tensors (size disagreeing with dtype and shape, duplicate names), std::system_error naming
// `path` for I/O errors (unwritable directory, full disk), CudaError for the GPU; on any error
// no file appears under `path` (an existing one is left as it was).
SaveStats save_safetensors(const std::filesystem::path& path, std::span<const SaveTensor> tensors,
                           const std::optional<SafetensorsMetadata>& metadata,
                           const SaveOptions& options = {});

// The same bytes in memory: `allocate(size)` returns where to put them (e.g. a Python bytes
// object's buffer), called once.
void serialize_safetensors(std::span<const SaveTensor> tensors,
                           const std::optional<SafetensorsMetadata>& metadata,
                           const std::function<std::byte*(std::uint64_t)>& allocate);

}  // namespace ferry
