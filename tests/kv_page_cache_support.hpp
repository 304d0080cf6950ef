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
#include <functional>
#include <memory>
#include <span>
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
inline std::filesystem::path slab_path(KVStore& store) {
  return store.stats().directory / "slab-0.dat";
}

// Reads the file through the page cache: every page of it resident afterwards (until the kernel
// reclaims some: see get_warm).
inline void warm_file(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0) << path;
  std::vector<char> buffer(1 << 20);
  while (::read(fd, buffer.data(), buffer.size()) > 0) {
  }
  ::close(fd);
}

// Reads the slab through the page cache.
inline void warm_slab(const std::filesystem::path& root) { warm_file(slab_path(root)); }

// Whether the get left page-cache DMA because its window was short of pages when it looked
// (ReadOnlyMapping::map_resident): after a warm_slab, only the kernel took them. Pages nobody
// maps may be reclaimed at any time, with memory free: e.g. by a proactive reclaim of cold
// physical memory (DAMON's pageout of unmapped file pages, as on the VMs these tests run on),
// whose regions a page just read may fall in.
inline bool window_was_short_of_pages(const KVResult& r) {
  return r.route != KVRoute::page_cache_dma &&
         r.route_reason.find("not fully in the page cache") != std::string::npos;
}

// Whether the block took the usual path while its window was being registered in the background
// (a get never waits for a registration).
inline bool window_was_registering(const KVResult& r) {
  return r.route != KVRoute::page_cache_dma &&
         r.route_reason.find("registering it in the background") != std::string::npos;
}

// Waits until the store's background registrations are done (a bound, not a timing: a hang
// fails the test instead of stalling it).
inline void wait_for_registrations(KVStore& store) {
  for (int i = 0; i < 60000 && store.stats().page_cache_windows_pending > 0; ++i)
    ::usleep(1000);
  ASSERT_EQ(store.stats().page_cache_windows_pending, 0u) << "a registration never finished";
}

// Gets that should use warm windows: a block whose window was resident but not yet registered
// took the usual path and asked for its registration; the get runs again once that is done.
// Where a block was served right but on the usual path because its window was short of pages
// (see above), the slab is warmed again and that block's get run again, a few times. Such a get
// registered nothing and counted no page-cache DMA; only the gets and hits counters and the
// slot's recency (touched again) see it, which the tests that use this do not check. The
// block's destination is cleared before it runs again (`clear`), so the bytes checked afterwards
// are the ones the last get landed. The last attempt's results are returned whatever they are,
// for the test to judge.
constexpr int kWarmGetAttempts = 5;

inline void clear_host_piece(const KVPiece& p) {
  ASSERT_FALSE(p.device.is_cuda()) << "clearing GPU memory needs the GPU tests' own clear";
  if (p.size) std::memset(p.data, 0, p.size);
}

inline std::vector<KVResult> get_warm(
    KVStore& store, std::span<const KVKey> keys, std::span<const KVBlock> blocks,
    const std::function<void(const KVPiece&)>& clear = clear_host_piece) {
  std::vector<KVResult> results = store.get(keys, blocks);
  for (int attempt = 1; attempt < kWarmGetAttempts; ++attempt) {
    std::vector<std::size_t> again;
    bool registering = false;
    for (std::size_t i = 0; i < results.size(); ++i) {
      if (!results[i].ok()) continue;
      if (window_was_registering(results[i])) {
        registering = true;
        again.push_back(i);
      } else if (window_was_short_of_pages(results[i])) {
        again.push_back(i);
      }
    }
    if (again.empty()) break;
    warm_file(slab_path(store));
    if (registering) wait_for_registrations(store);
    std::vector<KVKey> retry_keys;
    std::vector<KVBlock> retry_blocks;
    for (std::size_t i : again) {
      retry_keys.push_back(keys[i]);
      retry_blocks.push_back(blocks[i]);
      for (const KVPiece& p : blocks[i]) clear(p);
    }
    std::vector<KVResult> retried = store.get(retry_keys, retry_blocks);
    for (std::size_t j = 0; j < again.size(); ++j) results[again[j]] = std::move(retried[j]);
  }
  return results;
}

inline KVResult get_one_warm(KVStore& store, KVKey key, std::vector<std::byte>& out) {
  const KVPiece piece{out.data(), out.size()};
  const KVBlock block(&piece, 1);
  return get_warm(store, std::span(&key, 1), std::span(&block, 1))[0];
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
