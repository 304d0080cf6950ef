// The POSIX implementation of platform/system.hpp.
#include "platform/system.hpp"

#include <pthread.h>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ferry::detail {

void* allocate_pages(std::size_t bytes) noexcept {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  ::madvise(p, bytes, MADV_HUGEPAGE);  // advice only: no huge pages is still correct
  return p;
}

void free_pages(void* pages, std::size_t bytes) noexcept {
  if (pages) ::munmap(pages, bytes);
}

void* aligned_malloc(std::size_t alignment, std::size_t bytes) noexcept {
  void* p = nullptr;
  return ::posix_memalign(&p, alignment, bytes) == 0 ? p : nullptr;
}

void aligned_free(void* p) noexcept { std::free(p); }

std::uint64_t process_id() noexcept { return static_cast<std::uint64_t>(::getpid()); }

std::uint64_t physical_memory_bytes() noexcept {
  return static_cast<std::uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
         static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
}

void at_fork(void (*prepare)(), void (*parent)(), void (*child)()) noexcept {
  ::pthread_atfork(prepare, parent, child);
}

std::tm utc_time(std::time_t t) noexcept {
  std::tm utc{};
  ::gmtime_r(&t, &utc);
  return utc;
}

std::filesystem::path user_cache_directory() {
  if (const char* cache = std::getenv("XDG_CACHE_HOME"); cache && *cache) return cache;
  const char* home = std::getenv("HOME");
  return std::filesystem::path(home && *home ? home : "/tmp") / ".cache";
}

std::string filesystem_name(const std::string& path) {
  struct statfs fs {};
  if (::statfs(path.c_str(), &fs) != 0)
    return std::string("unknown (") + std::strerror(errno) + ")";
  switch (static_cast<unsigned long>(fs.f_type)) {
    case 0xEF53:
      return "ext4";
    case 0x58465342:
      return "xfs";
    case 0x01021994:
      return "tmpfs";
    case 0x9123683E:
      return "btrfs";
    case 0x794C7630:
      return "overlayfs";
    case 0x6969:
      return "nfs";
    case 0x0BD00BD0:
      return "lustre";
    case 0x47504653:
      return "gpfs";
    case 0x19830326:
      return "beegfs";
    case 0x6A656A63:
      return "virtiofs";
    case 0x65735546:
      return "fuse";
    case 0x01021997:
      return "9p";
    case 0x2FC12FC1:
      return "zfs";
    case 0xFF534D42:
      return "cifs";
    case 0x73717368:
      return "squashfs";
    default: {
      char text[40];
      std::snprintf(text, sizeof text, "unknown (0x%lx)", static_cast<unsigned long>(fs.f_type));
      return text;
    }
  }
}

}  // namespace ferry::detail
