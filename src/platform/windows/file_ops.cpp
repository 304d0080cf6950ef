// The Windows implementation of platform/file_ops.hpp: CreateFileW on the UTF-16 path, binary
// always, every file shared for reading, writing and deleting (as POSIX files are), and each
// Win32 error handed back as the nearest errno.
#include "platform/file_ops.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "platform/windows/win32.hpp"

namespace ferry::detail {
namespace {

HANDLE handle_of(NativeDescriptor fd) { return reinterpret_cast<HANDLE>(fd); }

constexpr DWORD kShareAll = FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE;
constexpr std::size_t kMaxTransfer = std::size_t{1} << 30;  // one call moves a DWORD at most
// FILE_INFO_BY_HANDLE_CLASS's FileRenameInfoEx (Windows 10 1709 and later), which mingw-w64's
// minwinbase.h declares only for a later _WIN32_WINNT than ferry's 0x0A00.
constexpr auto kFileRenameInfoEx = static_cast<FILE_INFO_BY_HANDLE_CLASS>(22);
// The two classes before it: FileIdExtdDirectoryRestartInfo (20), FileDispositionInfoEx (21).
static_assert(FileIdExtdDirectoryRestartInfo == 20);
// FILE_RENAME_FLAG_REPLACE_IF_EXISTS and FILE_RENAME_FLAG_POSIX_SEMANTICS, as documented (older
// SDK headers lack them).
constexpr DWORD kRenameReplaceIfExists = 0x1;
constexpr DWORD kRenamePosixSemantics = 0x2;

// Sets errno from the thread's last Win32 error; returns `failed` for the caller to hand back.
template <class T>
T fail_with_last_error(T failed) noexcept {
  errno = win32::errno_of(::GetLastError());
  return failed;
}

FileDescriptor create(const std::filesystem::path& path, DWORD access, DWORD disposition,
                      DWORD flags) noexcept {
  HANDLE h = ::CreateFileW(path.c_str(), access, kShareAll, nullptr, disposition,
                           FILE_ATTRIBUTE_NORMAL | flags, nullptr);
  if (h == INVALID_HANDLE_VALUE) return fail_with_last_error(FileDescriptor());
  return FileDescriptor(reinterpret_cast<NativeDescriptor>(h));
}

}  // namespace

FileDescriptor open_existing(const std::filesystem::path& path, bool writable,
                             bool direct) noexcept {
  return create(path, GENERIC_READ | (writable ? GENERIC_WRITE : 0), OPEN_EXISTING,
                direct ? FILE_FLAG_NO_BUFFERING : 0);
}

FileDescriptor open_or_create(const std::filesystem::path& path, unsigned) noexcept {
  return create(path, GENERIC_READ | GENERIC_WRITE, OPEN_ALWAYS, 0);
}

FileDescriptor create_new(const std::filesystem::path& path, unsigned) noexcept {
  return create(path, GENERIC_WRITE, CREATE_NEW, 0);
}

std::optional<FileIdentity> identity_of_open(NativeDescriptor fd) noexcept {
  BY_HANDLE_FILE_INFORMATION info{};
  if (!::GetFileInformationByHandle(handle_of(fd), &info))
    return fail_with_last_error(std::optional<FileIdentity>());
  const std::uint64_t written = (std::uint64_t{info.ftLastWriteTime.dwHighDateTime} << 32) |
                                info.ftLastWriteTime.dwLowDateTime;
  return FileIdentity{info.dwVolumeSerialNumber,
                      (std::uint64_t{info.nFileIndexHigh} << 32) | info.nFileIndexLow,
                      (std::uint64_t{info.nFileSizeHigh} << 32) | info.nFileSizeLow,
                      static_cast<std::int64_t>(written) * 100};
}

std::int64_t file_clock_now_ns() noexcept {
  FILETIME now{};
  ::GetSystemTimePreciseAsFileTime(&now);
  const std::uint64_t ticks =
      (std::uint64_t{now.dwHighDateTime} << 32) | now.dwLowDateTime;  // 100 ns since 1601
  return static_cast<std::int64_t>(ticks) * 100;
}

std::int64_t read_some_at(NativeDescriptor fd, void* buffer, std::size_t size,
                          std::uint64_t offset) noexcept {
  DWORD got = 0;
  if (!win32::read_at(handle_of(fd), buffer, static_cast<DWORD>(std::min(size, kMaxTransfer)),
                      offset, got))
    return fail_with_last_error(std::int64_t{-1});
  return got;
}

std::int64_t write_some_at(NativeDescriptor fd, const void* buffer, std::size_t size,
                           std::uint64_t offset) noexcept {
  DWORD put = 0;
  if (!win32::write_at(handle_of(fd), buffer, static_cast<DWORD>(std::min(size, kMaxTransfer)),
                       offset, put))
    return fail_with_last_error(std::int64_t{-1});
  return put;
}

bool set_file_size(NativeDescriptor fd, std::uint64_t size) noexcept {
  FILE_END_OF_FILE_INFO end{};
  end.EndOfFile.QuadPart = static_cast<LONGLONG>(size);
  if (!::SetFileInformationByHandle(handle_of(fd), FileEndOfFileInfo, &end, sizeof end))
    return fail_with_last_error(false);
  return true;
}

int preallocate(NativeDescriptor fd, std::uint64_t size) noexcept {
  // The clusters first, in one reservation where the volume can: a hint that some file systems
  // (and Wine) refuse. Then the end of file, which allocates whatever is still missing (NTFS
  // files are not sparse unless asked) and makes the space the file's bytes (they read as zeros).
  FILE_ALLOCATION_INFO allocation{};
  allocation.AllocationSize.QuadPart = static_cast<LONGLONG>(size);
  ::SetFileInformationByHandle(handle_of(fd), FileAllocationInfo, &allocation, sizeof allocation);
  return set_file_size(fd, size) ? 0 : errno;
}

bool sync_data(NativeDescriptor fd) noexcept { return sync_all(fd); }

bool sync_all(NativeDescriptor fd) noexcept {
  return ::FlushFileBuffers(handle_of(fd)) ? true : fail_with_last_error(false);
}

bool lock_exclusive(NativeDescriptor fd) noexcept {
  OVERLAPPED whole{};
  if (::LockFileEx(handle_of(fd), LOCKFILE_EXCLUSIVE_LOCK | LOCKFILE_FAIL_IMMEDIATELY, 0, MAXDWORD,
                   MAXDWORD, &whole))
    return true;
  const DWORD error = ::GetLastError();
  errno = error == ERROR_LOCK_VIOLATION || error == ERROR_IO_PENDING ? EWOULDBLOCK
                                                                     : win32::errno_of(error);
  return false;
}

bool rename_replacing(const std::filesystem::path& from, const std::filesystem::path& to) noexcept {
  if (::MoveFileExW(from.c_str(), to.c_str(), MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH))
    return true;
  if (::GetLastError() != ERROR_ACCESS_DENIED) return fail_with_last_error(false);
  const auto refused = [] {
    errno = EBUSY;  // the classic rename cannot replace a file that is open, and this one is
    return false;
  };
  // The target is open somewhere (a reader of the old file): the classic rename refuses to
  // replace it, the POSIX-semantics one (Windows 10 1809 and later, NTFS) replaces the name and
  // leaves the reader its file, as rename does on POSIX.
  FileDescriptor source = create(from, DELETE | GENERIC_WRITE, OPEN_EXISTING, 0);
  if (!source) return false;
  std::error_code error;
  const std::wstring target = std::filesystem::absolute(to, error).wstring();
  if (error) {
    errno = EINVAL;  // no current directory to resolve `to` against
    return false;
  }
  std::vector<std::byte> buffer(sizeof(FILE_RENAME_INFO) + target.size() * sizeof(wchar_t));
  auto* info = reinterpret_cast<FILE_RENAME_INFO*>(buffer.data());
  // Flags shares its place with ReplaceIfExists, and older SDK headers declare only that one.
  const DWORD flags = kRenameReplaceIfExists | kRenamePosixSemantics;
  std::memcpy(buffer.data(), &flags, sizeof flags);
  info->RootDirectory = nullptr;
  info->FileNameLength = static_cast<DWORD>(target.size() * sizeof(wchar_t));
  std::memcpy(info->FileName, target.c_str(), info->FileNameLength);
  if (!::SetFileInformationByHandle(handle_of(source.get()), kFileRenameInfoEx, info,
                                    static_cast<DWORD>(buffer.size()))) {
    const DWORD error = ::GetLastError();
    // Before Windows 10 1809, on volumes other than NTFS and under Wine: no such rename.
    if (error == ERROR_INVALID_PARAMETER || error == ERROR_NOT_SUPPORTED ||
        error == ERROR_INVALID_FUNCTION || error == ERROR_ACCESS_DENIED)
      return refused();
    errno = win32::errno_of(error);
    return false;
  }
  // What MOVEFILE_WRITE_THROUGH does for MoveFileExW: the file flushed, the rename with it.
  return sync_all(source.get());
}

bool remove_file(const std::filesystem::path& path) noexcept {
  return ::DeleteFileW(path.c_str()) ? true : fail_with_last_error(false);
}

bool create_directory(const std::filesystem::path& path, unsigned) noexcept {
  return ::CreateDirectoryW(path.c_str(), nullptr) ? true : fail_with_last_error(false);
}

bool sync_directory(const std::filesystem::path& directory) noexcept {
  const DWORD attributes = ::GetFileAttributesW(directory.c_str());
  if (attributes == INVALID_FILE_ATTRIBUTES) return fail_with_last_error(false);
  if ((attributes & FILE_ATTRIBUTE_DIRECTORY) == 0) {
    errno = ENOTDIR;
    return false;
  }
  return true;
}

}  // namespace ferry::detail
