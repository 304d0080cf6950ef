// The Windows implementation of platform/file_descriptor.hpp: a HANDLE from CreateFileW on the UTF-16
// path, read and written at explicit offsets, binary always.
#include "platform/file_descriptor.hpp"

#include <algorithm>
#include <cerrno>

#include "ferry/error.hpp"
#include "platform/windows/win32.hpp"

namespace ferry::detail {
namespace {

HANDLE handle_of(const FileDescriptor& fd) { return reinterpret_cast<HANDLE>(fd.get()); }

FileDescriptor::Native native_of(HANDLE h) { return reinterpret_cast<FileDescriptor::Native>(h); }

constexpr DWORD kShareAll = FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE;
constexpr std::size_t kMaxTransfer = std::size_t{1} << 30;

}  // namespace

FileDescriptor& FileDescriptor::operator=(FileDescriptor&& other) noexcept {
  if (this != &other) {
    if (_fd != kNone) ::CloseHandle(reinterpret_cast<HANDLE>(_fd));
    _fd = std::exchange(other._fd, kNone);
  }
  return *this;
}

FileDescriptor::~FileDescriptor() {
  if (_fd != kNone) ::CloseHandle(reinterpret_cast<HANDLE>(_fd));
}

FileDescriptor open_for_reading(const std::filesystem::path& path) {
  HANDLE h = ::CreateFileW(path.c_str(), GENERIC_READ, kShareAll, nullptr, OPEN_EXISTING,
                           FILE_ATTRIBUTE_NORMAL | FILE_FLAG_BACKUP_SEMANTICS, nullptr);
  if (h == INVALID_HANDLE_VALUE) win32::fail(::GetLastError(), path.string());
  return FileDescriptor(native_of(h));
}

FileDescriptor try_open_direct(const std::filesystem::path& path) {
  HANDLE h = ::CreateFileW(path.c_str(), GENERIC_READ, kShareAll, nullptr, OPEN_EXISTING,
                           FILE_FLAG_NO_BUFFERING, nullptr);
  if (h == INVALID_HANDLE_VALUE) errno = win32::errno_of(::GetLastError());
  return FileDescriptor(native_of(h));
}

FileDescriptor create_for_writing(const std::filesystem::path& path) {
  HANDLE h = ::CreateFileW(path.c_str(), GENERIC_READ | GENERIC_WRITE, kShareAll, nullptr,
                           CREATE_ALWAYS, FILE_ATTRIBUTE_NORMAL, nullptr);
  if (h == INVALID_HANDLE_VALUE) win32::fail(::GetLastError(), path.string(), ": cannot create");
  return FileDescriptor(native_of(h));
}

void write_exact(const FileDescriptor& fd, const void* buffer, std::size_t size,
                 std::uint64_t offset, const std::filesystem::path& path) {
  const auto* in = static_cast<const char*>(buffer);
  std::size_t done = 0;
  while (done < size) {
    DWORD put = 0;
    const DWORD want = static_cast<DWORD>(std::min(size - done, kMaxTransfer));
    if (!win32::write_at(handle_of(fd), in + done, want, offset + done, put))
      win32::fail(::GetLastError(), path.string(), ": write failed");
    if (put == 0) fail_errno(ENOSPC, path.string(), ": write made no progress");
    done += put;
  }
}

std::uint64_t file_size(const FileDescriptor& fd, const std::filesystem::path& path) {
  BY_HANDLE_FILE_INFORMATION info{};
  if (!::GetFileInformationByHandle(handle_of(fd), &info))
    win32::fail(::GetLastError(), path.string());
  FERRY_EXPECT(::GetFileType(handle_of(fd)) == FILE_TYPE_DISK &&
                   (info.dwFileAttributes & FILE_ATTRIBUTE_DIRECTORY) == 0,
               std::invalid_argument, path.string(), ": not a regular file");
  return (std::uint64_t{info.nFileSizeHigh} << 32) | info.nFileSizeLow;
}

std::size_t read_up_to(const FileDescriptor& fd, void* buffer, std::size_t size,
                       std::uint64_t offset, const std::filesystem::path& path) {
  auto* out = static_cast<char*>(buffer);
  std::size_t done = 0;
  while (done < size) {
    DWORD got = 0;
    const DWORD want = static_cast<DWORD>(std::min(size - done, kMaxTransfer));
    if (!win32::read_at(handle_of(fd), out + done, want, offset + done, got))
      win32::fail(::GetLastError(), path.string(), ": read of ", size, " bytes at offset ", offset,
                  " failed");
    if (got == 0) break;
    done += got;
  }
  return done;
}

}  // namespace ferry::detail
