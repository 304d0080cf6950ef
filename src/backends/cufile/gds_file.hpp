// Moving bytes between a file and GPU memory through cuFile, in either direction: the
// device -> storage half of the KV-cache store, and its storage -> device reads. Offsets and
// sizes need no alignment: aligned bodies go through cuFile, unaligned edges through host memory.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "ferry/io_types.hpp"

namespace ferry {

class GdsFile {
 public:
  // Opens (creating it when `writable`) for GPU `device`. Throws CudaError where cuFile cannot
  // run, and std::invalid_argument where it would run in compatibility mode and
  // `allow_compat` is false.
  static GdsFile open(const std::filesystem::path& path, bool writable, int device = 0,
                      bool allow_compat = false);

  GdsFile(GdsFile&&) noexcept;
  GdsFile& operator=(GdsFile&&) noexcept;
  ~GdsFile();

  // `size` bytes at `file_offset` into the GPU memory at `device_address`.
  void read(std::uint64_t file_offset, void* device_address, std::uint64_t size) const;
  // `size` bytes of GPU memory at `device_address` to `file_offset`; durable on return.
  void write(std::uint64_t file_offset, const void* device_address, std::uint64_t size) const;

  IoPath io_path() const noexcept;       // CufileGds or CufileCompat
  const std::string& reason() const noexcept;  // why that mode

 private:
  struct State;
  explicit GdsFile(std::unique_ptr<State> state);
  std::unique_ptr<State> _state;
};

}  // namespace ferry
