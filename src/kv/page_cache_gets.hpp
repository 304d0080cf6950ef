// Page-cache DMA for KV gets (KVStoreOptions::page_cache_pin_bytes): a block whose slab window
// is wholly in the page cache is copied to its destination straight from the window's pages,
// mapped read-only and registered with the GPU driver (the process's PageCacheRegistry,
// transfer/page_cache_registry.hpp): one pass over host memory (the DMA) instead of the staged
// path's three, plus the checksum's.
//
// Windows: whole slots, about 64 MiB (kWindowTarget), aligned in the slab, so that no block
// straddles two. Registering costs a fixed driver call plus work per page; 64 MiB amortises the
// first over ~16k pages, while a put unregisters only the 64 MiB around the slots it writes (a
// re-registration of a few milliseconds at the next warm get), and the budget's LRU evicts at
// that grain rather than whole slabs of gigabytes.
//
// Never unverified bytes: each block's copies are queued first, and once they completed (their
// event), its XXH3 is taken from the same mapping and compared with the index's; a change of
// the pages between copy and hash shows as a mismatch. Blocks are hashed on several workers, so
// the tail after the last copy is one block's hash.
//
// Coherence: an O_DIRECT write cannot drop page-cache pages a registration pins (the kernel keeps
// the stale page), so writes of this store go through writing(): while it lasts gets take no
// window it overlaps, and those windows are unregistered first (waiting for gets that hold
// them). Another process's writes can still leave a registered window stale: a mismatch on the
// DMA path drops the window, drops the block's pages from the page cache and hands the block
// back for the usual path to re-read from the file (whose checksum decides: a corrupt slab byte
// is still a miss).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "kv/block_io.hpp"
#include "kv/slab_files.hpp"
#include "platform/file.hpp"

namespace ferry::detail::kv {

class PageCacheGets {
 public:
  static constexpr std::uint64_t kWindowTarget = 64ull << 20;

  // Slabs of `slab_bytes` each, slots of `slot_bytes`; at most `budget_bytes` of windows
  // registered at once (the process's registry, shared with loads, holds them).
  PageCacheGets(const SlabFiles& slabs, std::uint64_t slot_bytes, std::uint64_t slab_bytes,
                std::uint64_t budget_bytes);
  PageCacheGets(const PageCacheGets&) = delete;
  PageCacheGets& operator=(const PageCacheGets&) = delete;

  std::uint64_t window_bytes() const { return _window_bytes; }

  // While alive, the windows the batch's slots overlap are not served, and none of them stays
  // registered (made after those gets that hold one finished with it).
  class Writing {
   public:
    Writing() = default;
    Writing(Writing&& other) noexcept
        : _owner(std::exchange(other._owner, nullptr)), _windows(std::move(other._windows)) {}
    Writing(const Writing&) = delete;
    Writing& operator=(const Writing&) = delete;
    Writing& operator=(Writing&&) = delete;
    ~Writing();

   private:
    friend class PageCacheGets;
    PageCacheGets* _owner = nullptr;
    std::vector<std::pair<int, std::uint64_t>> _windows;  // (slab, window index)
  };
  Writing writing(std::span<const BlockRequest> batch);

  // Copies and verifies what it can of `blocks` (checksum set: a get's requests). Those served
  // end with route page_cache_dma (or a checksum mismatch where the file itself is bad); the
  // others are returned, untouched but for route_reason (why not), for the usual path.
  std::vector<BlockRequest*> read(std::span<BlockRequest* const> blocks);

  PageCacheCounters counters() const;

 private:
  struct Window {
    int slab = 0;
    std::uint64_t index = 0;
    bool operator<(const Window& o) const {
      return slab != o.slab ? slab < o.slab : index < o.index;
    }
  };
  Window window_of(const BlockRequest& r) const {
    return {r.slab, r.offset / _window_bytes};
  }
  std::uint64_t window_size(const Window& w) const;
  // Stops serving `w` and waits until no registration of it is left (no lease of it held here).
  void release(const Window& w);

  const SlabFiles& _slabs;
  std::uint64_t _slot_bytes, _slab_bytes, _window_bytes, _budget;
  std::vector<PlatformFile> _files;  // the slabs, opened read-only for mapping

  mutable std::mutex _mutex;
  std::map<Window, unsigned> _writing;  // windows puts of this store are writing into
  PageCacheCounters _counters;
};

}  // namespace ferry::detail::kv
