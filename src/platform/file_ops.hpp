// The file-system calls that durable writers need beyond platform/file.hpp's PlatformFile: the
// saver's temporary file and the KV store's journal, checkpoint, slabs and writer lock. Each
// call answers as its POSIX counterpart does (an empty descriptor, false, or -1, with errno set),
// so that callers word their errors once for every system. platform/posix/file_ops.cpp and
// platform/windows/file_ops.cpp implement it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>

#include "platform/file_descriptor.hpp"
#include "platform/file.hpp"

namespace ferry::detail {

using NativeDescriptor = FileDescriptor::Native;

// An existing file, read-only or read-write; `direct`: unbuffered (O_DIRECT;
// FILE_FLAG_NO_BUFFERING), which a file system may refuse (EINVAL). Neither this nor
// open_or_create waits where the name is a FIFO: callers check for a regular file (file_size).
FileDescriptor open_existing(const std::filesystem::path& path, bool writable,
                             bool direct = false) noexcept;
// Read-write, created with `mode` (before the umask; ignored on Windows) where missing.
FileDescriptor open_or_create(const std::filesystem::path& path, unsigned mode) noexcept;
// Write-only, created; EEXIST where the name is taken (O_EXCL; CREATE_NEW).
FileDescriptor create_new(const std::filesystem::path& path, unsigned mode) noexcept;

// What the open file is now: identity (device, inode; volume and file index on Windows) and size.
std::optional<FileIdentity> identity_of_open(NativeDescriptor fd) noexcept;
// Now, on the clock of FileIdentity::mtime_ns (the system's wall clock: ns since 1970 on POSIX,
// since 1601 on Windows).
std::int64_t file_clock_now_ns() noexcept;

// One positioned transfer (pread/pwrite; ReadFile/WriteFile at an OVERLAPPED offset): the bytes
// moved, 0 at the end of the file, -1 with errno set.
std::int64_t read_some_at(NativeDescriptor fd, void* buffer, std::size_t size,
                          std::uint64_t offset) noexcept;
std::int64_t write_some_at(NativeDescriptor fd, const void* buffer, std::size_t size,
                           std::uint64_t offset) noexcept;

// Cuts or extends the file to `size` (ftruncate; the end-of-file information on Windows).
bool set_file_size(NativeDescriptor fd, std::uint64_t size) noexcept;
// Reserves `size` bytes so that later writes need no new space; returns 0 or the error
// (posix_fallocate's convention; on Windows the allocation size, then the end of file).
int preallocate(NativeDescriptor fd, std::uint64_t size) noexcept;
// Makes the written data durable: fdatasync (only the metadata reads need) or fsync (all of it).
// Windows has one call for both, FlushFileBuffers.
bool sync_data(NativeDescriptor fd) noexcept;
bool sync_all(NativeDescriptor fd) noexcept;
// Takes the whole-file exclusive lock without waiting (flock LOCK_EX|LOCK_NB; LockFileEx),
// held until the descriptor closes; EWOULDBLOCK where another holder has it.
bool lock_exclusive(NativeDescriptor fd) noexcept;

// Renames `from` over `to` atomically: a crash leaves one of the two files under `to`
// (rename; on Windows MoveFileExW with MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH,
// which returns once the rename is on the disk). Where `to` is open elsewhere, Windows' classic
// rename refuses; the POSIX-semantics rename (Windows 10 1809 and later, NTFS) replaces it, and
// where that does not exist either (older Windows, other file systems, Wine) the answer is
// EBUSY: close the target first.
bool rename_replacing(const std::filesystem::path& from, const std::filesystem::path& to) noexcept;
// Removes a file name (unlink; DeleteFileW). Other holders keep the file open.
bool remove_file(const std::filesystem::path& path) noexcept;
// Creates one directory with `mode` (ignored on Windows); EEXIST where it exists.
bool create_directory(const std::filesystem::path& path, unsigned mode) noexcept;
// Makes the directory's entries (files created or renamed in it) durable: fsync of the
// directory on POSIX. Windows has no such call (FlushFileBuffers refuses directories): there the
// renames are written through (rename_replacing) and NTFS logs the creation of names, so this
// checks only that the directory exists. Returns false with errno set.
bool sync_directory(const std::filesystem::path& directory) noexcept;

}  // namespace ferry::detail
