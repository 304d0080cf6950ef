#include "platform/file_ranges.hpp"

namespace ferry::detail {
namespace {

template <bool kWrite>
std::int64_t slices_at(NativeDescriptor fd, const IoSlice* slices, std::size_t count,
                       std::uint64_t offset) noexcept {
  std::int64_t done = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const std::int64_t n =
        kWrite ? write_some_at(fd, slices[i].data, slices[i].size, offset + done)
               : read_some_at(fd, slices[i].data, slices[i].size, offset + done);
    if (n < 0) return done > 0 ? done : n;
    done += n;
    if (static_cast<std::size_t>(n) < slices[i].size) break;
  }
  return done;
}

}  // namespace

std::int64_t read_slices_at(NativeDescriptor fd, const IoSlice* slices, std::size_t count,
                            std::uint64_t offset) noexcept {
  return slices_at<false>(fd, slices, count, offset);
}

std::int64_t write_slices_at(NativeDescriptor fd, const IoSlice* slices, std::size_t count,
                             std::uint64_t offset) noexcept {
  return slices_at<true>(fd, slices, count, offset);
}

// Windows cannot report page-cache residency (platform/windows/file.cpp says the same).
bool range_resident(NativeDescriptor, std::uint64_t, std::uint64_t) noexcept { return false; }
bool range_resident_sampled(NativeDescriptor, std::uint64_t, std::uint64_t, unsigned) noexcept {
  return false;
}

void drop_cached_pages(NativeDescriptor) noexcept {}
void drop_cached_range(NativeDescriptor, std::uint64_t, std::uint64_t) noexcept {}

}  // namespace ferry::detail
