// A read-only, shared mapping of an open file (the whole file, or a window of it): the page
// cache's own pages in this process's address space, for page-cache DMA (services/page_cache_registry.hpp). POSIX only
// (platform/posix/file_mapping.cpp); on Windows mapping refuses with "not supported on this
// platform" (platform/windows/file_mapping.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "platform/file.hpp"

namespace ferry::detail {

// Whether this platform can map files for page-cache DMA at all.
bool file_mapping_supported() noexcept;

class ReadOnlyMapping {
 public:
  // What mapping found: the mapping (empty where it refused) and, where it did, why (in words:
  // "only 83% of its pages are in the page cache", "not supported on this platform").
  struct Result;

  // Maps the first `size` bytes of `file` (PROT_READ, MAP_SHARED). Where every page is already
  // in the page cache (mincore), faults them all in now (MADV_POPULATE_READ, else one read per
  // page), so that registering and copying never wait for the disk; otherwise unmaps and says
  // how much was resident. Throws std::system_error naming the file where mmap itself fails.
  static Result map_resident(const PlatformFile& file, std::uint64_t size);
  // The same for the window [offset, offset + size) of the file: data() is the byte at
  // `offset` (the mapping itself starts at the page holding it).
  static Result map_resident(const PlatformFile& file, std::uint64_t offset, std::uint64_t size);

  ReadOnlyMapping() = default;
  ReadOnlyMapping(const ReadOnlyMapping&) = delete;
  ReadOnlyMapping& operator=(const ReadOnlyMapping&) = delete;
  ReadOnlyMapping(ReadOnlyMapping&& other) noexcept;
  ReadOnlyMapping& operator=(ReadOnlyMapping&& other) noexcept;
  ~ReadOnlyMapping();  // munmap

  const std::byte* data() const noexcept { return _data; }
  std::uint64_t size() const noexcept { return _size; }
  explicit operator bool() const noexcept { return _data != nullptr; }

 private:
  ReadOnlyMapping(const std::byte* data, std::uint64_t size, std::uint64_t lead) noexcept
      : _data(data), _size(size), _lead(lead) {}
  void release() noexcept;

  const std::byte* _data = nullptr;
  std::uint64_t _size = 0;
  std::uint64_t _lead = 0;  // bytes mapped before _data (the window's offset within its page)
};

struct ReadOnlyMapping::Result {
  ReadOnlyMapping mapping;
  std::string refusal;  // empty where mapped
};

inline ReadOnlyMapping::Result ReadOnlyMapping::map_resident(const PlatformFile& file,
                                                             std::uint64_t size) {
  return map_resident(file, 0, size);
}

}  // namespace ferry::detail
