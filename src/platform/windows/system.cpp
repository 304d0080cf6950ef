// The Windows implementation of platform/system.hpp.
#include "platform/system.hpp"

#include <malloc.h>

#include <cstdlib>

#include "platform/windows/win32.hpp"

namespace ferry::detail {

void* allocate_pages(std::size_t bytes) noexcept {
  // Committed and zeroed, aligned to the allocation granularity (64 KiB), so page-aligned.
  return ::VirtualAlloc(nullptr, bytes, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);
}

void free_pages(void* pages, std::size_t) noexcept {
  if (pages) ::VirtualFree(pages, 0, MEM_RELEASE);
}

void* aligned_malloc(std::size_t alignment, std::size_t bytes) noexcept {
  return ::_aligned_malloc(bytes, alignment);
}

void aligned_free(void* p) noexcept { ::_aligned_free(p); }

std::uint64_t process_id() noexcept { return ::GetCurrentProcessId(); }

std::uint64_t physical_memory_bytes() noexcept {
  MEMORYSTATUSEX status{};
  status.dwLength = sizeof status;
  return ::GlobalMemoryStatusEx(&status) ? status.ullTotalPhys : 0;
}

void at_fork(void (*)(), void (*)(), void (*)()) noexcept {}

std::tm utc_time(std::time_t t) noexcept {
  std::tm utc{};
  ::gmtime_s(&utc, &t);
  return utc;
}

std::filesystem::path user_cache_directory() {
  // The environment block itself is UTF-16: read it wide so non-ASCII user names survive.
  if (const wchar_t* local = ::_wgetenv(L"LOCALAPPDATA"); local && *local) return local;
  if (const wchar_t* temp = ::_wgetenv(L"TEMP"); temp && *temp) return temp;
  return std::filesystem::temp_directory_path();
}

std::string filesystem_name(const std::string& path) {
  // The volume holding `path`: its root, then the file system's name (NTFS, ReFS, FAT32...).
  const std::wstring wide = win32::widen(path);
  wchar_t root[MAX_PATH + 1] = {};
  if (!::GetVolumePathNameW(wide.c_str(), root, MAX_PATH))
    return "unknown (" + win32::message_of(::GetLastError()) + ")";
  wchar_t name[MAX_PATH + 1] = {};
  if (!::GetVolumeInformationW(root, nullptr, 0, nullptr, nullptr, nullptr, name, MAX_PATH))
    return "unknown (" + win32::message_of(::GetLastError()) + ")";
  return win32::narrow(name);
}

}  // namespace ferry::detail
