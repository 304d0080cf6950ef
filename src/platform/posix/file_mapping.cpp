// The POSIX implementation of platform/file_mapping.hpp.
#include "platform/file_mapping.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <utility>
#include <vector>

#include "ferry/error.hpp"

// Linux 5.14's value, for C libraries whose headers predate it (older kernels refuse it: EINVAL).
#if defined(__linux__) && !defined(MADV_POPULATE_READ)
#define MADV_POPULATE_READ 22
#endif

namespace ferry::detail {
namespace {

std::uint64_t page_bytes() {
  static const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

// Pages of [data, data + size) in the page cache now, counted in windows of 64 Ki pages so the
// answer's vector stays small.
std::uint64_t resident_pages(const void* data, std::uint64_t size) {
  const std::uint64_t page = page_bytes();
  const std::uint64_t pages = (size + page - 1) / page;
  constexpr std::uint64_t kWindow = 65536;
  std::vector<unsigned char> resident(std::min(pages, kWindow));
  std::uint64_t in_cache = 0;
  for (std::uint64_t first = 0; first < pages; first += kWindow) {
    const std::uint64_t n = std::min(kWindow, pages - first);
    auto* at = const_cast<char*>(static_cast<const char*>(data)) + first * page;
    if (::mincore(at, std::min(n * page, size - first * page), resident.data()) != 0) return 0;
    for (std::uint64_t i = 0; i < n; ++i) in_cache += resident[i] & 1;
  }
  return in_cache;
}

// Faults every page in, so registration and copies never wait for a page fault or the disk.
void populate(const std::byte* data, std::uint64_t size) {
#ifdef MADV_POPULATE_READ
  if (::madvise(const_cast<std::byte*>(data), size, MADV_POPULATE_READ) == 0) return;
#endif
  // Kernels before 5.14: one read per page.
  const std::uint64_t page = page_bytes();
  volatile std::byte sink{};
  for (std::uint64_t at = 0; at < size; at += page) sink = data[at];
  (void)sink;
}

}  // namespace

bool file_mapping_supported() noexcept { return true; }

ReadOnlyMapping::Result ReadOnlyMapping::map_resident(const PlatformFile& file,
                                                      std::uint64_t offset, std::uint64_t size) {
  Result result;
  if (size == 0) {
    result.refusal = offset == 0 ? "the file is empty" : "the window is empty";
    return result;
  }
  const std::uint64_t lead = offset % page_bytes();
  const std::uint64_t mapped = lead + size;
  void* map = ::mmap(nullptr, mapped, PROT_READ, MAP_SHARED, static_cast<int>(file.native(false)),
                     static_cast<off_t>(offset - lead));
  if (map == MAP_FAILED)
    fail_errno(errno, file.path().string(), ": mmap of ", size, " bytes at offset ", offset);
  ReadOnlyMapping mapping(static_cast<const std::byte*>(map) + lead, size, lead);
  const std::uint64_t pages = (mapped + page_bytes() - 1) / page_bytes();
  const std::uint64_t resident = resident_pages(map, mapped);
  if (resident < pages) {
    char percent[32];
    std::snprintf(percent, sizeof percent, "%.1f%%",
                  100.0 * static_cast<double>(resident) / static_cast<double>(pages));
    result.refusal = std::string("not fully in the page cache (") + percent + " of its pages)";
    return result;  // unmapped as `mapping` goes
  }
  populate(static_cast<const std::byte*>(map), mapped);
  result.mapping = std::move(mapping);
  return result;
}

ReadOnlyMapping::ReadOnlyMapping(ReadOnlyMapping&& other) noexcept
    : _data(std::exchange(other._data, nullptr)),
      _size(std::exchange(other._size, 0)),
      _lead(std::exchange(other._lead, 0)) {}

ReadOnlyMapping& ReadOnlyMapping::operator=(ReadOnlyMapping&& other) noexcept {
  if (this != &other) {
    release();
    _data = std::exchange(other._data, nullptr);
    _size = std::exchange(other._size, 0);
    _lead = std::exchange(other._lead, 0);
  }
  return *this;
}

ReadOnlyMapping::~ReadOnlyMapping() { release(); }

void ReadOnlyMapping::release() noexcept {
  if (_data != nullptr) ::munmap(const_cast<std::byte*>(_data - _lead), _lead + _size);
  _data = nullptr;
}

}  // namespace ferry::detail
