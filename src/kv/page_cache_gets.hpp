// Page-cache DMA for KV gets (KVStoreOptions::page_cache_pin_bytes): a block whose slab window
// is wholly in the page cache is copied to its destination straight from the window's pages,
// mapped read-only and registered with the GPU driver (the process's PageCacheRegistry,
// services/page_cache_registry.hpp): one pass over host memory (the DMA) instead of the staged
// path's three (read into pinned slots, hash, copy out).
//
// Windows: whole slots, about 64 MiB (kWindowTarget), aligned in the slab, so that no block
// straddles two. Registering costs a fixed driver call plus work per page; 64 MiB amortises the
// first over ~16k pages, while a put unregisters only the 64 MiB around the slots it writes (a
// re-registration of a few milliseconds at the next warm get), and the budget's LRU evicts at
// that grain rather than whole slabs of gigabytes.
//
// Never unverified bytes, and verified where they landed: the pages a registration pins can
// differ from what the mapping shows (a write around the page cache replaces the cached page
// while the pinned one stays), so the checksum is taken of the bytes the DMA wrote, on the GPU
// that received them (cuda/gpu_checksum.hpp), in order on the stream of the copies. A block of
// one piece lands in its destination and is hashed there; a block of several pieces (per-layer
// K and V) lands in a device bounce buffer, is hashed there, and is scattered device-to-device
// into its pieces only once it matched. Blocks go in chunks on two streams per device, so one
// chunk's copies run while the one before is hashed. Where the GPU checksum cannot run (a build
// without nvcc, a driver without module calls), blocks take the usual path, saying why.
//
// Coherence: an O_DIRECT write cannot drop page-cache pages a registration pins (the kernel keeps
// the stale page), so writes of this store go through writing(): while it lasts gets take no
// window it overlaps, and those windows are unregistered first (waiting for gets that hold
// them). Another process's writes can still leave a registered window stale: a mismatch on the
// DMA path drops the window, drops the block's pages from the page cache and hands the block
// back for the usual path to re-read from the file (whose own checksum decides: a corrupt slab
// byte is still a miss).
#pragma once

#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kv/block_io.hpp"
#include "kv/slab_files.hpp"
#include "kv/window_registrar.hpp"
#include "platform/file.hpp"

namespace ferry::detail::kv {

class PageCacheGets {
 public:
  static constexpr std::uint64_t kWindowTarget = 64ull << 20;

  // Slabs of `slab_bytes` each, slots of `slot_bytes`; at most `budget_bytes` of windows
  // registered at once (the process's registry, shared with loads, holds them).
  PageCacheGets(const SlabFiles& slabs, std::uint64_t slot_bytes, std::uint64_t slab_bytes,
                std::uint64_t budget_bytes);
  ~PageCacheGets();
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
  // end with route page_cache_dma; the others (a stale window's blocks among them) are returned
  // with route_reason set (why not) for the usual path, which decides hit or miss.
  std::vector<BlockRequest*> read(std::span<BlockRequest* const> blocks);

  PageCacheCounters counters() const;

  // Registers windows in the background; its Busy marks the store's transfers, which it lets run
  // first.
  WindowRegistrar& registrar() { return _registrar; }

 private:
  struct Window {
    int slab = 0;
    std::uint64_t index = 0;
    bool operator<(const Window& o) const {
      return slab != o.slab ? slab < o.slab : index < o.index;
    }
  };
  Window window_of(const BlockRequest& r) const { return {r.slab, r.offset / _window_bytes}; }
  std::uint64_t window_size(const Window& w) const;
  // Stops serving `w` and waits until no registration of it is left (no lease of it held here).
  void release(const Window& w);

  struct Served;  // a block taken from a window (page_cache_gets.cpp)
  struct Lanes;   // per device: streams, bounce buffers, checksum scratch
  struct Times {  // device (or host) seconds of one get, added to the counters
    double dma = 0, checksum = 0, scatter = 0;
  };
  struct Chunk;   // blocks of one get queued together on one lane
  Lanes& lanes(int ordinal);

  // read()'s steps: the blocks that can take a window (the others to `rest`, saying why), their
  // copies and checks, then their outcomes and the counters.
  std::vector<Served> take_windows(std::span<BlockRequest* const> blocks,
                                   std::vector<BlockRequest*>& rest);
  std::string why_not_served(const BlockRequest& r, int& ordinal,
                             std::map<int, std::string>& no_checksum) const;
  // Where `w` is not registered: why its blocks take the usual path, and its registration asked
  // for in the background where it is resident. Under _mutex.
  std::string not_registered(const Window& w);
  // The registrar's work: registers `w` ("" where it did, else why not).
  std::string register_window(const Window& w);
  Times land(std::vector<Served>& served);
  void settle(std::vector<Served>& served, std::vector<BlockRequest*>& rest, const Times& times);

  // Copies `blocks` (all bound for GPU `ordinal`) out of their windows and checks each where it
  // landed; sets each one's verdict. Returns with no copy running.
  void land_on_gpu(int ordinal, std::span<Served* const> blocks, Times& times);
  static std::vector<std::unique_ptr<Chunk>> cut_in_chunks(std::span<Served* const> blocks,
                                                           std::uint64_t* digests);
  void queue_chunk(int ordinal, Lanes& device, std::size_t lane, Chunk& c);
  static void fail(std::span<Served* const> blocks, const std::exception& e);
  // The same for host memory (tests' stand-in registrars serve it): memcpy, then XXH3.
  void land_in_host(std::span<Served* const> blocks, Times& times);

  const SlabFiles& _slabs;
  std::uint64_t _slot_bytes, _slab_bytes, _window_bytes, _budget;
  std::vector<PlatformFile> _files;  // the slabs, opened read-only for mapping

  mutable std::mutex _mutex;
  std::map<Window, unsigned> _writing;  // windows puts of this store are writing into
  PageCacheCounters _counters;
  std::map<int, std::unique_ptr<Lanes>> _lanes;  // under _mutex; each used under its own
  // Registers windows gets found resident but unregistered (after the above: it calls into
  // them until joined).
  WindowRegistrar _registrar;
};

}  // namespace ferry::detail::kv
