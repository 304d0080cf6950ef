// The process-wide cache of cuFile-registered files, and the edges of cuFile transfers that go
// through host memory (unaligned heads and tails).
#pragma once

#include <cstdint>
#include <filesystem>

#include "backends/cufile/handle_cache.hpp"

namespace ferry::detail {

// Opens with O_DIRECT (plain open where the file system refuses it, which only compatibility
// mode can use) and registers with cuFile. Never destroyed: deregistering at exit could call
// into a cuFile that has shut down.
HandleCache& cufile_handles();

// Device <-> file for a range whose pieces split_aligned decides; `device_base` plus
// `device_offset` is the first GPU byte. `registered_base` is the start of a cuFileBufRegister'ed
// buffer holding the range, or null. Edges go through an 8 KiB host bounce buffer.
void cufile_read(const HandleCache::Lease& file, const std::filesystem::path& path,
                 std::uint64_t file_offset, std::uintptr_t device_address, std::uint64_t size,
                 std::uintptr_t registered_base, std::uint64_t max_piece);
void cufile_write(const HandleCache::Lease& file, const std::filesystem::path& path,
                  std::uint64_t file_offset, std::uintptr_t device_address, std::uint64_t size,
                  std::uint64_t max_piece);

}  // namespace ferry::detail
