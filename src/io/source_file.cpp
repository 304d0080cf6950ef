#include "io/source_file.hpp"

#include <cstring>

#include "ferry/error.hpp"

namespace ferry::detail {
namespace {

std::uint64_t align_down(std::uint64_t v) { return v / kDirectAlignment * kDirectAlignment; }
std::uint64_t align_up(std::uint64_t v) { return align_down(v + kDirectAlignment - 1); }

std::string percent(double fraction) {
  return std::to_string(static_cast<int>(fraction * 100 + 0.5)) + "%";
}

std::shared_ptr<const FileSet> own_set(const std::filesystem::path& path) {
  auto set = FileSet::create(1);
  set->add(path);
  return set;
}

}  // namespace

double page_cache_fraction(const FileDescriptor& fd, std::uint64_t size) {
  return page_cache_fraction(static_cast<NativeFile>(fd.get()), size);
}

SourceFile::SourceFile(std::shared_ptr<const FileSet> files, std::uint32_t index, IoMode mode,
                       bool writing)
    : _files(std::move(files)), _index(index), _mode(mode), _writing(writing) {}

SourceFile::SourceFile(const std::filesystem::path& path, IoMode mode)
    : SourceFile(own_set(path), 0, mode) {
  _held = open();
}

std::shared_ptr<const PlatformFile> SourceFile::open() {
  _touched.store(true, std::memory_order_relaxed);
  std::call_once(_chosen, [&] { choose(*_files->acquire(_index, false)); });
  return _files->acquire(_index, direct());
}

void SourceFile::choose(const PlatformFile& file) {
  std::lock_guard lock(_reason_mutex);
  if (_mode == IoMode::Buffered) {
    _reason = _writing ? "buffered writes requested" : "buffered reads requested";
    return;
  }
  if (_mode == IoMode::Auto && _writing) {
    _reason = "writes bypass the page cache where the file system allows";
  } else if (_mode == IoMode::Auto && !page_cache_residency_measured()) {
    _reason = "this system cannot report page-cache residency: unbuffered where allowed";
  } else if (_mode == IoMode::Auto) {
    // A file mostly in the page cache reads far faster through it than from the device.
    const double cached = file.residency(kResidencyMaxAge);
    _reason = percent(cached) + " of the file is in the page cache";
    if (cached >= kBufferedFromResidency) return;
  }
  if (!_files->acquire(_index, true)->has_direct()) {
    const std::string why = file.direct_refusal();
    FERRY_EXPECT(_mode != IoMode::Direct, std::invalid_argument, file.path().string(),
                 ": O_DIRECT was requested but the file system refuses it (", why, ")");
    _reason += "; O_DIRECT refused by the file system (" + why + ")";
    return;
  }
  _use_direct = true;
  if (_mode == IoMode::Direct) _reason = "O_DIRECT requested";
}

const std::byte* SourceFile::read(std::uint64_t offset, std::uint64_t size, std::byte* staging) {
  return read(*_held, offset, size, staging);
}

const std::byte* SourceFile::read(const PlatformFile& file, std::uint64_t offset,
                                  std::uint64_t size, std::byte* staging) {
  if (direct() && file.has_direct()) {
    if (const std::byte* data = read_direct(file, offset, size, staging)) return data;
  }
  const std::uint64_t head = offset % kDirectAlignment;
  const std::size_t got = file.read_up_to(staging + head, size, offset, false);
  FERRY_FORMAT_EXPECT(got == size, file.path().string(), ": unexpected end of file at offset ",
                      offset + got, " (wanted ", size, " bytes at offset ", offset, ")");
  _bytes_read.fetch_add(size, std::memory_order_relaxed);
  return staging + head;
}

bool SourceFile::read_into(const PlatformFile& file, std::uint64_t offset, std::uint64_t size,
                           std::byte* memory) {
  bool direct_read = direct() && file.has_direct();
  if (direct_read) {
    const auto address = reinterpret_cast<std::uintptr_t>(memory);
    if (offset % kDirectAlignment || size % kDirectAlignment || address % kDirectAlignment)
      return false;
    try {
      const std::size_t got = file.read_up_to(memory, size, offset, true);
      FERRY_FORMAT_EXPECT(got == size, file.path().string(), ": unexpected end of file at offset ",
                          offset + got, " (wanted ", size, " bytes at offset ", offset, ")");
      _bytes_read.fetch_add(size, std::memory_order_relaxed);
      return true;
    } catch (const std::system_error& e) {
      // Some file systems accept O_DIRECT at open and refuse it at read time.
      if (e.code() != std::errc::invalid_argument) throw;
      fall_back_to_buffered(std::string("O_DIRECT read refused (") + e.what() + ")");
    }
  }
  const std::size_t got = file.read_up_to(memory, size, offset, false);
  FERRY_FORMAT_EXPECT(got == size, file.path().string(), ": unexpected end of file at offset ",
                      offset + got, " (wanted ", size, " bytes at offset ", offset, ")");
  _bytes_read.fetch_add(size, std::memory_order_relaxed);
  return true;
}

const std::byte* SourceFile::read_direct(const PlatformFile& file, std::uint64_t offset,
                                         std::uint64_t size, std::byte* staging) {
  const std::uint64_t start = align_down(offset);
  const std::uint64_t length = align_up(offset + size) - start;
  std::size_t got = 0;
  try {
    got = file.read_up_to(staging, length, start, true);
  } catch (const std::system_error& e) {
    // Some file systems accept O_DIRECT at open and refuse it at read time.
    if (e.code() != std::errc::invalid_argument) throw;
    fall_back_to_buffered(std::string("O_DIRECT read refused (") + e.what() + ")");
    return nullptr;
  }
  const std::uint64_t head = offset - start;
  FERRY_FORMAT_EXPECT(got >= head + size, file.path().string(),
                      ": unexpected end of file at offset ", start + got, " (wanted ", size,
                      " bytes at offset ", offset, ")");
  _bytes_read.fetch_add(length, std::memory_order_relaxed);
  return staging + head;
}

void SourceFile::write(const PlatformFile& file, std::uint64_t offset, std::uint64_t size,
                       const std::byte* staging) {
  const std::byte* data = staging + offset % kDirectAlignment;
  const std::uint64_t end = offset + size;
  const std::uint64_t body_start = align_up(offset);
  const std::uint64_t body_end = align_down(end);
  if (direct() && file.has_direct() && body_end > body_start) {
    try {
      file.write_all(data + (body_start - offset), body_end - body_start, body_start, true);
      if (body_start > offset) file.write_all(data, body_start - offset, offset, false);
      if (end > body_end)
        file.write_all(data + (body_end - offset), end - body_end, body_end, false);
      _bytes_read.fetch_add(size, std::memory_order_relaxed);
      return;
    } catch (const std::system_error& e) {
      if (e.code() != std::errc::invalid_argument) throw;
      fall_back_to_buffered(std::string("O_DIRECT write refused (") + e.what() + ")");
    }
  }
  file.write_all(data, size, offset, false);
  _bytes_read.fetch_add(size, std::memory_order_relaxed);
}

void SourceFile::fall_back_to_buffered(const std::string& why) {
  std::lock_guard lock(_reason_mutex);
  if (_use_direct.exchange(false))
    _reason += "; " + why + (_writing ? ", written buffered instead" : ", read buffered instead");
}

FileLoadStats SourceFile::stats() const {
  std::lock_guard lock(_reason_mutex);
  return FileLoadStats{_files->path(_index), _use_direct ? IoPath::Direct : IoPath::Buffered,
                       _reason, _bytes_read.load()};
}

}  // namespace ferry::detail
