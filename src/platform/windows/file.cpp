// The Windows implementation of platform/file.hpp: CreateFileW on the UTF-16 path, a buffered
// handle and, where the volume allows it, a FILE_FLAG_NO_BUFFERING one (sector-aligned
// transfers, like O_DIRECT), positioned I/O through OVERLAPPED offsets, binary always (Win32
// handles never translate CRLF or stop at 0x1A; only the C runtime's text mode does).
#include "platform/file.hpp"

#include <algorithm>
#include <cerrno>

#include "ferry/error.hpp"
#include "platform/windows/win32.hpp"

namespace ferry::detail {
namespace {

HANDLE handle_of(NativeFile f) { return reinterpret_cast<HANDLE>(f); }
NativeFile native_of(HANDLE h) { return reinterpret_cast<NativeFile>(h); }

// Other readers, writers and renames of the file stay possible while ferry holds it, as on POSIX.
constexpr DWORD kShareAll = FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE;
// One ReadFile/WriteFile moves at most this much (a DWORD count), a multiple of any sector size.
constexpr std::size_t kMaxTransfer = std::size_t{1} << 30;

[[noreturn]] void open_failed(DWORD error, const std::filesystem::path& path) {
  if (error == ERROR_TOO_MANY_OPEN_FILES)
    win32::fail(error, path.string(), ": too many open files (this process's limit is reached)");
  win32::fail(error, path.string());
}

FileIdentity identity_of(HANDLE file, const std::filesystem::path& path) {
  BY_HANDLE_FILE_INFORMATION info{};
  if (!::GetFileInformationByHandle(file, &info)) win32::fail(::GetLastError(), path.string());
  const std::uint64_t written = (std::uint64_t{info.ftLastWriteTime.dwHighDateTime} << 32) |
                                info.ftLastWriteTime.dwLowDateTime;
  // The volume serial number and the file index name the file as device and inode do.
  return {info.dwVolumeSerialNumber,
          (std::uint64_t{info.nFileIndexHigh} << 32) | info.nFileIndexLow,
          (std::uint64_t{info.nFileSizeHigh} << 32) | info.nFileSizeLow,
          static_cast<std::int64_t>(written) * 100};  // 100 ns ticks
}

bool is_directory(HANDLE file) {
  BY_HANDLE_FILE_INFORMATION info{};
  return ::GetFileInformationByHandle(file, &info) &&
         (info.dwFileAttributes & FILE_ATTRIBUTE_DIRECTORY) != 0;
}

}  // namespace

void close_native_file(NativeFile f) noexcept { ::CloseHandle(handle_of(f)); }

PlatformFile PlatformFile::open(const std::filesystem::path& path, FileAccess access,
                                bool want_direct) {
  PlatformFile f;
  f._path = path;
  f._access = access;
  const bool writable = access == FileAccess::ReadWrite;
  // FILE_FLAG_BACKUP_SEMANTICS lets a directory open, so that it is named as such below rather
  // than reported as "access denied".
  HANDLE h = ::CreateFileW(path.c_str(), GENERIC_READ | (writable ? GENERIC_WRITE : 0), kShareAll,
                           nullptr, writable ? OPEN_ALWAYS : OPEN_EXISTING,
                           FILE_ATTRIBUTE_NORMAL | FILE_FLAG_BACKUP_SEMANTICS, nullptr);
  if (h == INVALID_HANDLE_VALUE) open_failed(::GetLastError(), path);
  f._buffered = native_of(h);
  FERRY_EXPECT(::GetFileType(h) == FILE_TYPE_DISK && !is_directory(h), std::invalid_argument,
               path.string(), ": not a regular file");
  f._identity = identity_of(h, path);
  if (want_direct) f.add_direct();
  return f;
}

FileIdentity PlatformFile::current_identity() const {
  return identity_of(handle_of(_buffered), _path);
}

bool PlatformFile::add_direct() {
  if (has_direct()) return true;
  if (!_direct_refusal.empty()) return false;  // refused once: the volume will again
  const DWORD rights = GENERIC_READ | (_access == FileAccess::ReadWrite ? GENERIC_WRITE : 0);
  // ReOpenFile reaches the file already open, not whatever the path names now (POSIX goes
  // through /proc/self/fd for the same reason).
  HANDLE h = ::ReOpenFile(handle_of(_buffered), rights, kShareAll, FILE_FLAG_NO_BUFFERING);
  if (h == INVALID_HANDLE_VALUE) {
    const DWORD error = ::GetLastError();
    if (error == ERROR_TOO_MANY_OPEN_FILES) open_failed(error, _path);
    _direct_refusal = win32::message_of(error);
    return false;
  }
  if (!identity_of(h, _path).same_file(_identity)) {
    ::CloseHandle(h);
    fail_errno(kFileChangedErrno, _path.string(),
               ": the file changed underneath ferry (replaced or removed since it was opened)");
  }
  _direct.store(native_of(h), std::memory_order_release);
  return true;
}

std::size_t PlatformFile::read_up_to(void* buffer, std::size_t size, std::uint64_t offset,
                                     bool direct) const {
  const HANDLE h = handle_of(native(direct));
  auto* out = static_cast<char*>(buffer);
  std::size_t done = 0;
  while (done < size) {
    const DWORD want =
        static_cast<DWORD>(std::min(size - done, direct ? kMaxDirectCall : kMaxTransfer));
    DWORD got = 0;
    if (!win32::read_at(h, out + done, want, offset + done, got))
      win32::fail(::GetLastError(), _path.string(), ": read of ", size, " bytes at offset ", offset,
                  " failed");
    if (got == 0) break;
    done += got;
  }
  return done;
}

void PlatformFile::write_all(const void* buffer, std::size_t size, std::uint64_t offset,
                             bool direct) const {
  const HANDLE h = handle_of(native(direct));
  const auto* in = static_cast<const char*>(buffer);
  std::size_t done = 0;
  while (done < size) {
    const DWORD want =
        static_cast<DWORD>(std::min(size - done, direct ? kMaxDirectCall : kMaxTransfer));
    DWORD put = 0;
    if (!win32::write_at(h, in + done, want, offset + done, put))
      win32::fail(::GetLastError(), _path.string(), ": write of ", size, " bytes at offset ",
                  offset, " failed");
    if (put == 0)
      fail_errno(ENOSPC, _path.string(), ": write of ", size, " bytes at offset ", offset,
                 " stopped after ", done);
    done += put;
  }
}

void PlatformFile::sync() const {
  if (!::FlushFileBuffers(handle_of(_buffered)))
    win32::fail(::GetLastError(), _path.string(), ": FlushFileBuffers");
}

// Windows offers no documented way to ask which pages of a file its cache holds: residency is
// "unknown" (0), so auto reads unbuffered, the choice that is right for a cold cache.
double page_cache_fraction(NativeFile, std::uint64_t size) { return size == 0 ? 1.0 : 0.0; }
bool page_cache_residency_measured() noexcept { return false; }

// Nothing to cache: page_cache_fraction answers at once on Windows.
double PlatformFile::residency(double) const {
  return page_cache_fraction(_buffered, _identity.size);
}

std::optional<FileIdentity> identity_at(const std::filesystem::path& path) {
  // No access rights asked: only the file's information is read.
  win32::Handle h(::CreateFileW(path.c_str(), 0, kShareAll, nullptr, OPEN_EXISTING,
                                FILE_FLAG_BACKUP_SEMANTICS, nullptr));
  if (!h || ::GetFileType(h.get()) != FILE_TYPE_DISK || is_directory(h.get())) return std::nullopt;
  return identity_of(h.get(), path);
}

// Windows has no per-process handle limit in the range that matters (about 16 million).
std::uint64_t open_file_limit() { return 0; }

}  // namespace ferry::detail
