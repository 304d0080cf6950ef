// Scatter/gather positioned I/O and page-cache questions about byte ranges, for the KV store's
// slabs (platform/file_ops.hpp has the single-buffer calls). Answers as the POSIX calls do: the
// bytes moved, 0 at the end of the file, -1 with errno set. platform/posix/file_ranges.cpp and
// platform/windows/file_ranges.cpp implement it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "platform/file_ops.hpp"

namespace ferry::detail {

struct IoSlice {
  void* data = nullptr;
  std::size_t size = 0;
};

// One positioned transfer of the slices in order (preadv/pwritev; on Windows one
// ReadFile/WriteFile per slice, stopping at the first short one).
std::int64_t read_slices_at(NativeDescriptor fd, const IoSlice* slices, std::size_t count,
                            std::uint64_t offset) noexcept;
std::int64_t write_slices_at(NativeDescriptor fd, const IoSlice* slices, std::size_t count,
                             std::uint64_t offset) noexcept;
// Whether every page of [offset, offset + length) of the open file is in the page cache now
// (mincore over a temporary mapping); false where that cannot be told (Windows).
bool range_resident(NativeDescriptor fd, std::uint64_t offset, std::uint64_t length) noexcept;
// range_resident() of a sample: `windows` runs of 16 pages spread evenly over the range (its
// first and last pages among them), or every page where the range holds no more. A guide for
// choosing buffered reads, at a small fraction of the full probe's cost on a large range (which
// pays per page); never a promise.
bool range_resident_sampled(NativeDescriptor fd, std::uint64_t offset, std::uint64_t length,
                            unsigned windows) noexcept;
// Drops the file's clean pages from the page cache (posix_fadvise DONTNEED); nothing on Windows.
void drop_cached_pages(NativeDescriptor fd) noexcept;
// The same for the pages of [offset, offset + length) only (pages mapped or pinned stay).
void drop_cached_range(NativeDescriptor fd, std::uint64_t offset, std::uint64_t length) noexcept;

}  // namespace ferry::detail
