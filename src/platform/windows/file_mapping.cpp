// platform/file_mapping.hpp on Windows: page-cache DMA needs the CUDA driver to pin a file
// mapping's pages, which ferry does only on Linux. Every file says so and takes the staged path.
#include "platform/file_mapping.hpp"

#include <utility>

namespace ferry::detail {

bool file_mapping_supported() noexcept { return false; }

ReadOnlyMapping::Result ReadOnlyMapping::map_resident(const PlatformFile&, std::uint64_t,
                                                      std::uint64_t) {
  Result result;
  result.refusal = "not supported on this platform";
  return result;
}

ReadOnlyMapping::ReadOnlyMapping(ReadOnlyMapping&& other) noexcept
    : _data(std::exchange(other._data, nullptr)), _size(std::exchange(other._size, 0)) {}

ReadOnlyMapping& ReadOnlyMapping::operator=(ReadOnlyMapping&& other) noexcept {
  if (this != &other) {
    _data = std::exchange(other._data, nullptr);
    _size = std::exchange(other._size, 0);
  }
  return *this;
}

ReadOnlyMapping::~ReadOnlyMapping() { release(); }

void ReadOnlyMapping::release() noexcept { _data = nullptr; }  // never mapped here

}  // namespace ferry::detail
