#include "io/source_file.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "ferry/error.hpp"

namespace ferry::detail {
namespace {

std::uint64_t align_down(std::uint64_t v) { return v / kDirectAlignment * kDirectAlignment; }
std::uint64_t align_up(std::uint64_t v) { return align_down(v + kDirectAlignment - 1); }

std::string percent(double fraction) {
  return std::to_string(static_cast<int>(fraction * 100 + 0.5)) + "%";
}

}  // namespace

double page_cache_fraction(const FileDescriptor& fd, std::uint64_t size) {
  if (size == 0) return 1.0;
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (map == MAP_FAILED) return 0.0;
  const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t pages = (size + page - 1) / page;
  constexpr std::uint64_t kWindowPages = 16;
  const std::uint64_t windows =
      pages <= kResidencySamplePages ? 1 : kResidencySamplePages / kWindowPages;
  const std::uint64_t window_pages = windows == 1 ? pages : kWindowPages;
  std::vector<unsigned char> resident(window_pages);
  std::uint64_t asked = 0;
  std::uint64_t in_cache = 0;
  for (std::uint64_t w = 0; w < windows; ++w) {
    // Window w starts w/windows of the way into the file; the last one ends at its end.
    const std::uint64_t first = std::min(pages - window_pages, pages * w / windows);
    const std::uint64_t length = std::min(window_pages * page, size - first * page);
    if (::mincore(static_cast<char*>(map) + first * page, length, resident.data()) != 0) break;
    const std::uint64_t n = (length + page - 1) / page;
    for (std::uint64_t i = 0; i < n; ++i) in_cache += resident[i] & 1;
    asked += n;
  }
  ::munmap(map, size);
  return asked ? static_cast<double>(in_cache) / static_cast<double>(asked) : 0.0;
}

SourceFile::SourceFile(const std::filesystem::path& path, IoMode mode)
    : _path(path), _buffered(open_for_reading(path)), _size(file_size(_buffered, path)) {
  if (mode == IoMode::Buffered) {
    _reason = "buffered reads requested";
    return;
  }
  if (mode == IoMode::Auto) {
    // A file mostly in the page cache reads far faster through it than from the device.
    const double cached = page_cache_fraction(_buffered, _size);
    if (cached >= 0.5) {
      _reason = percent(cached) + " of the file is in the page cache";
      return;
    }
    _reason = percent(cached) + " of the file is in the page cache";
  }
  _direct = try_open_direct(path);
  if (!_direct) {
    const int err = errno;
    FERRY_EXPECT(mode != IoMode::Direct, std::invalid_argument, path.string(),
                 ": O_DIRECT was requested but the file system refuses it (",
                 std::strerror(err), ")");
    _reason += "; O_DIRECT refused by the file system (" + std::string(std::strerror(err)) + ")";
    return;
  }
  _use_direct = true;
  if (mode == IoMode::Direct) _reason = "O_DIRECT requested";
}

const std::byte* SourceFile::read(std::uint64_t offset, std::uint64_t size, std::byte* staging) {
  if (_use_direct.load(std::memory_order_relaxed)) {
    if (const std::byte* data = read_direct(offset, size, staging)) return data;
  }
  const std::uint64_t head = offset % kDirectAlignment;
  read_exact(_buffered, staging + head, size, offset, _path);
  _bytes_read.fetch_add(size, std::memory_order_relaxed);
  return staging + head;
}

const std::byte* SourceFile::read_direct(std::uint64_t offset, std::uint64_t size,
                                         std::byte* staging) {
  const std::uint64_t start = align_down(offset);
  const std::uint64_t length = align_up(offset + size) - start;
  std::size_t got = 0;
  try {
    got = read_up_to(_direct, staging, length, start, _path);
  } catch (const std::system_error& e) {
    // Some file systems accept O_DIRECT at open and refuse it at read time.
    if (e.code() != std::errc::invalid_argument) throw;
    fall_back_to_buffered(std::string("O_DIRECT read refused (") + e.what() + ")");
    return nullptr;
  }
  const std::uint64_t head = offset - start;
  FERRY_FORMAT_EXPECT(got >= head + size, _path.string(), ": unexpected end of file at offset ",
                      start + got, " (wanted ", size, " bytes at offset ", offset, ")");
  _bytes_read.fetch_add(length, std::memory_order_relaxed);
  return staging + head;
}

void SourceFile::fall_back_to_buffered(const std::string& why) {
  std::lock_guard lock(_reason_mutex);
  if (_use_direct.exchange(false)) _reason += "; " + why + ", read buffered instead";
}

FileLoadStats SourceFile::stats() const {
  std::lock_guard lock(_reason_mutex);
  return FileLoadStats{_path, _use_direct ? IoPath::Direct : IoPath::Buffered, _reason,
                       _bytes_read.load()};
}

}  // namespace ferry::detail
