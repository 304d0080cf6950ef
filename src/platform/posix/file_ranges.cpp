#include "platform/file_ranges.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

namespace ferry::detail {

static_assert(sizeof(IoSlice) == sizeof(iovec));

std::int64_t read_slices_at(NativeDescriptor fd, const IoSlice* slices, std::size_t count,
                            std::uint64_t offset) noexcept {
  return ::preadv(fd, reinterpret_cast<const iovec*>(slices), static_cast<int>(count),
                  static_cast<off_t>(offset));
}

std::int64_t write_slices_at(NativeDescriptor fd, const IoSlice* slices, std::size_t count,
                             std::uint64_t offset) noexcept {
  return ::pwritev(fd, reinterpret_cast<const iovec*>(slices), static_cast<int>(count),
                   static_cast<off_t>(offset));
}

bool range_resident(NativeDescriptor fd, std::uint64_t offset, std::uint64_t length) noexcept {
  if (length == 0) return true;
  static const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t first = offset / page * page;
  const std::uint64_t bytes = offset + length - first;
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(first));
  if (map == MAP_FAILED) return false;
  bool all = false;
  try {
    thread_local std::vector<unsigned char> resident;
    resident.resize((bytes + page - 1) / page);
    if (::mincore(map, bytes, resident.data()) == 0) {
      all = true;
      for (unsigned char r : resident) all = all && (r & 1);
    }
  } catch (...) {
    all = false;  // no memory for the answer: not known to be cached
  }
  ::munmap(map, bytes);
  return all;
}

bool range_resident_sampled(NativeDescriptor fd, std::uint64_t offset, std::uint64_t length,
                            unsigned windows) noexcept {
  constexpr std::uint64_t kWindowPages = 16;
  static const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t first = offset / page * page;
  const std::uint64_t bytes = offset + length - first;
  const std::uint64_t pages = (bytes + page - 1) / page;
  if (length == 0 || windows < 2 || pages <= windows * kWindowPages)
    return range_resident(fd, offset, length);
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(first));
  if (map == MAP_FAILED) return false;
  bool all = true;
  unsigned char resident[kWindowPages];
  for (unsigned w = 0; w < windows && all; ++w) {
    const std::uint64_t at = w * (pages - kWindowPages) / (windows - 1);  // in pages
    const std::uint64_t n = std::min(kWindowPages * page, bytes - at * page);
    if (::mincore(static_cast<unsigned char*>(map) + at * page, n, resident) != 0) {
      all = false;
      break;
    }
    for (std::uint64_t i = 0; i < (n + page - 1) / page; ++i) all = all && (resident[i] & 1);
  }
  ::munmap(map, bytes);
  return all;
}

void drop_cached_pages(NativeDescriptor fd) noexcept {
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
}

void drop_cached_range(NativeDescriptor fd, std::uint64_t offset, std::uint64_t length) noexcept {
  ::posix_fadvise(fd, static_cast<off_t>(offset), static_cast<off_t>(length),
                  POSIX_FADV_DONTNEED);
}

}  // namespace ferry::detail
