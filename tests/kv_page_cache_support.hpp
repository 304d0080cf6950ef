// Helpers of the KV page-cache DMA tests (CPU with a host stand-in registrar, and GPU): a
// one-slab store with page-cache DMA on, its slab read into the page cache, and writes into the
// slab behind the store's back (buffered, or O_DIRECT as another process's put).
#pragma once

#include <fcntl.h>
#include <linux/falloc.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ferry/kv_store.hpp"
#include "kv_test_support.hpp"

namespace ferry::test {

// Page-cache DMA on; one slab, so that the n-th put takes slot n (at n x slot bytes).
inline KVStoreOptions page_cache_options(std::uint64_t pin_bytes) {
  KVStoreOptions options;
  options.slab_count = 1;
  options.gpu_path = KVPath::Staged;
  options.page_cache_pin_bytes = pin_bytes;
  options.checkpoint_on_close = false;
  return options;
}

inline std::filesystem::path slab_path(const std::filesystem::path& root) {
  return root / KVStore::directory_name(kv_namespace()) / "slab-0.dat";
}

// Reads the slab through the page cache: every page of it resident afterwards.
inline void warm_slab(const std::filesystem::path& root) {
  const int fd = ::open(slab_path(root).c_str(), O_RDONLY);
  ASSERT_GE(fd, 0) << slab_path(root);
  std::vector<char> buffer(1 << 20);
  while (::read(fd, buffer.data(), buffer.size()) > 0) {
  }
  ::close(fd);
}

// Writes `bytes` at `offset` of the slab behind the store: buffered (the page cache's pages
// change), or with O_DIRECT (around the page cache, as another process's put; false where the
// file system refuses O_DIRECT). `bytes` is a multiple of 4 KiB for O_DIRECT.
inline bool write_behind(const std::filesystem::path& root, std::uint64_t offset,
                         const std::vector<std::byte>& bytes, bool direct) {
  const int fd = ::open(slab_path(root).c_str(), O_WRONLY | (direct ? O_DIRECT : 0));
  if (fd < 0) return false;
  void* aligned = nullptr;
  if (::posix_memalign(&aligned, 4096, bytes.size()) != 0) {
    ::close(fd);
    return false;
  }
  std::memcpy(aligned, bytes.data(), bytes.size());
  const bool ok = ::pwrite(fd, aligned, bytes.size(), static_cast<off_t>(offset)) ==
                      static_cast<ssize_t>(bytes.size()) &&
                  ::fdatasync(fd) == 0;
  std::free(aligned);
  ::close(fd);
  return ok;
}

// Replaces `bytes` at `offset` of the slab behind the store so that a registered window over them
// is left stale, whatever the file system: the range is punched out first (which takes its pages
// out of the page cache even where a registration pins them: those keep the old bytes), then
// written through the page cache into fresh pages. False where the file system cannot punch
// holes. `offset` and the size are multiples of 4 KiB.
inline bool replace_behind(const std::filesystem::path& root, std::uint64_t offset,
                           const std::vector<std::byte>& bytes) {
  const int fd = ::open(slab_path(root).c_str(), O_WRONLY);
  if (fd < 0) return false;
  const bool punched =
      ::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                  static_cast<off_t>(bytes.size())) == 0;
  ::close(fd);
  return punched && write_behind(root, offset, bytes, false);
}

// A block's bytes padded to its 4 KiB slot (what O_DIRECT writes).
inline std::vector<std::byte> slot_image(const std::vector<std::byte>& bytes) {
  std::vector<std::byte> slot((bytes.size() + 4095) / 4096 * 4096);
  std::copy(bytes.begin(), bytes.end(), slot.begin());
  return slot;
}

}  // namespace ferry::test
