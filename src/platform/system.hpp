// The process-level services ferry needs from the operating system beyond files: page-aligned
// memory, the process id, fork hooks and the per-user cache directory. platform/posix/ and
// platform/windows/ implement it; nothing above platform/ calls the OS for these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <string>

namespace ferry::detail {

// Page-aligned, zeroed memory of at least `bytes` (mmap; VirtualAlloc on Windows), with
// transparent huge pages asked for where the system has them. Null when the system refuses.
void* allocate_pages(std::size_t bytes) noexcept;
// Frees what allocate_pages(bytes) returned.
void free_pages(void* pages, std::size_t bytes) noexcept;

// Heap memory aligned to `alignment` (a power of two; posix_memalign, _aligned_malloc on
// Windows), freed with aligned_free. Null when memory runs out.
void* aligned_malloc(std::size_t alignment, std::size_t bytes) noexcept;
void aligned_free(void* p) noexcept;

std::uint64_t process_id() noexcept;
std::uint64_t physical_memory_bytes() noexcept;

// Runs `prepare` before a fork() and `parent`/`child` after it in each process
// (pthread_atfork). Windows has no fork: nothing to do there.
void at_fork(void (*prepare)(), void (*parent)(), void (*child)()) noexcept;

// `t` as UTC calendar time (gmtime_r; gmtime_s on Windows).
std::tm utc_time(std::time_t t) noexcept;

// Where per-user cache files go: $XDG_CACHE_HOME, else $HOME/.cache (else /tmp/.cache) on
// POSIX; %LOCALAPPDATA% on Windows.
std::filesystem::path user_cache_directory();

// "ext4", "xfs", "tmpfs", "NTFS", ... for the file system holding `path` (UTF-8), or
// "unknown (why)".
std::string filesystem_name(const std::string& path);

// Whether the disks under the file system holding `path` (UTF-8) are NVMe, as the system reports
// it: "yes: <disks>", "no: <which disk is on what>" or "unknown: <why>", never a guess. Linux asks
// sysfs for the block device; Windows asks the volume's disks (IOCTL_STORAGE_QUERY_PROPERTY).
std::string nvme_verdict(const std::string& path);

// Whether BypassIO (Windows 11's path for non-cached reads from the file system straight to the
// storage driver, which DirectStorage uses) is allowed for the file or directory `path` (UTF-8):
// "on: ...", "off: <the driver that vetoes it and why>" or "unknown: <why>". Empty where the
// system has no BypassIO (all but Windows).
std::string bypass_io_verdict(const std::string& path);

}  // namespace ferry::detail
