#include "kv/page_cache_gets.hpp"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <set>
#include <string>

#include "cuda/cuda_resources.hpp"
#include "ferry/error.hpp"
#include "platform/file_ranges.hpp"
#include "transfer/copier.hpp"
#include "transfer/page_cache_registry.hpp"
#include "transfer/worker_pool.hpp"

namespace ferry::detail::kv {
namespace {

// Hashing workers per get: enough to keep up with one device's DMA (XXH3 runs at about a
// quarter of it per core), few enough to leave the machine's other work its cores.
constexpr unsigned kHashWorkers = 8;

std::uint64_t total(const BlockRequest& r) {
  std::uint64_t sum = 0;
  for (const BlockSpan& p : r.pieces) sum += p.size;
  return sum;
}

std::string milliseconds(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f ms", seconds * 1e3);
  return text;
}

// A block served from a window: its lease, where its bytes sit in the mapping, the events
// behind its copies, and what the hash found.
struct Served {
  BlockRequest* request = nullptr;
  PageCacheRegistry::Lease lease;
  const std::byte* source = nullptr;
  std::uint64_t length = 0;
  std::vector<std::pair<int, PooledEvent>> ends;  // (device ordinal, event) per GPU copier used
  std::string reason;
  enum class Verdict { pending, match, mismatch, failed } verdict = Verdict::pending;
  std::string failure;  // where failed: why, for the usual path's reason
};

// Waits for the block's copies, then hashes it from the mapping.
void verify(Served& s) {
  try {
    if (!s.ends.empty()) {
      RelaxedCaptureMode relaxed;
      for (auto& [ordinal, end] : s.ends) {
        device_context(ordinal).make_current();
        end->synchronize();
      }
    }
    const bool same = XXH3_64bits(s.source, s.length) == s.request->checksum;
    s.verdict = same ? Served::Verdict::match : Served::Verdict::mismatch;
  } catch (const std::exception& e) {
    s.failure = e.what();
    s.verdict = Served::Verdict::failed;
  }
}

// verify() of every block, on up to kHashWorkers threads of the process's transfer pool (the
// caller's among them), blocks taken in copy order. A helper that starts only after the caller
// finished returns at once: the get never waits for pool threads busy with other work.
void verify_all(std::vector<Served>& served) {
  if (served.empty()) return;
  struct Shared {
    std::atomic<std::size_t> next{0};
    std::mutex mutex;
    std::condition_variable idle;
    unsigned active = 0;
    bool closed = false;
  };
  auto shared = std::make_shared<Shared>();
  Served* blocks = served.data();
  const std::size_t count = served.size();
  const auto work = [blocks, count](Shared& sh) {
    for (std::size_t i; (i = sh.next.fetch_add(1)) < count;)
      if (blocks[i].verdict == Served::Verdict::pending) verify(blocks[i]);
  };
  unsigned helpers = static_cast<unsigned>(std::min<std::size_t>(kHashWorkers, count) - 1);
  if (helpers > 0) helpers = std::min(helpers, transfer_workers().reserve(helpers));
  if (helpers > 0)
    transfer_workers().post(
        [shared, work] {
          {
            std::lock_guard lock(shared->mutex);
            if (shared->closed) return;
            ++shared->active;
          }
          work(*shared);
          std::lock_guard lock(shared->mutex);
          if (--shared->active == 0) shared->idle.notify_all();
        },
        helpers);
  work(*shared);
  std::unique_lock lock(shared->mutex);
  shared->closed = true;
  shared->idle.wait(lock, [&] { return shared->active == 0; });
}

}  // namespace

PageCacheGets::PageCacheGets(const SlabFiles& slabs, std::uint64_t slot_bytes,
                             std::uint64_t slab_bytes, std::uint64_t budget_bytes)
    : _slabs(slabs),
      _slot_bytes(slot_bytes),
      _slab_bytes(slab_bytes),
      _window_bytes(std::max<std::uint64_t>(1, kWindowTarget / slot_bytes) * slot_bytes),
      _budget(budget_bytes) {
  for (unsigned i = 0; i < slabs.count(); ++i)
    _files.push_back(PlatformFile::open(slabs.path(static_cast<int>(i)), FileAccess::Read, false));
}

std::uint64_t PageCacheGets::window_size(const Window& w) const {
  const std::uint64_t offset = w.index * _window_bytes;
  return std::min(_window_bytes, _slab_bytes - std::min(offset, _slab_bytes));
}

void PageCacheGets::release(const Window& w) {
  page_cache_registry().release_range(_files[w.slab].identity(), w.index * _window_bytes,
                                      window_size(w), true);
}

PageCacheGets::Writing PageCacheGets::writing(std::span<const BlockRequest> batch) {
  Writing guard;
  guard._owner = this;
  {
    std::lock_guard lock(_mutex);
    for (const BlockRequest& r : batch) {
      const Window w = window_of(r);
      const std::pair<int, std::uint64_t> key{w.slab, w.index};
      if (std::find(guard._windows.begin(), guard._windows.end(), key) != guard._windows.end())
        continue;
      guard._windows.push_back(key);
      ++_writing[w];
    }
  }
  // No get takes these windows from here on; those registered go once their gets let go.
  for (const auto& [slab, index] : guard._windows) release({slab, index});
  return guard;
}

PageCacheGets::Writing::~Writing() {
  if (!_owner) return;
  std::lock_guard lock(_owner->_mutex);
  for (const auto& [slab, index] : _windows) {
    auto it = _owner->_writing.find({slab, index});
    if (it != _owner->_writing.end() && --it->second == 0) _owner->_writing.erase(it);
  }
}

std::vector<BlockRequest*> PageCacheGets::read(std::span<BlockRequest* const> blocks) {
  PageCacheRegistry& registry = page_cache_registry();
  std::vector<BlockRequest*> rest;
  std::vector<Served> served;
  served.reserve(blocks.size());
  {
    // Leases of this get, one registry call per window; taken under the lock that writing()
    // marks windows under, so no window a put is writing into is registered meanwhile.
    std::map<Window, PageCacheRegistry::Acquired> windows;
    std::lock_guard lock(_mutex);
    for (BlockRequest* r : blocks) {
      for (const BlockSpan& p : r->pieces) {
        if (p.size == 0 || registry.serves(p.device)) continue;
        r->route_reason = p.device.is_cuda()
                              ? "page-cache DMA (" + registry.registrar_name() +
                                    ") does not serve " + p.device.to_string()
                              : "its destination is host memory (page-cache DMA serves GPU "
                                "memory)";
        break;
      }
      if (!r->route_reason.empty()) {
        rest.push_back(r);
        continue;
      }
      const Window w = window_of(*r);
      if (_writing.count(w)) {
        r->route_reason = "a put is writing into its window";
        rest.push_back(r);
        continue;
      }
      auto found = windows.find(w);
      if (found == windows.end()) {
        const std::uint64_t offset = w.index * _window_bytes;
        auto got = registry.acquire_window(_files[w.slab], offset, window_size(w), _budget);
        if (got.registered_now) {
          ++_counters.registered;
          _counters.register_seconds += got.register_seconds;
        }
        if (!got.lease)
          got.why_not = "its window (" + _slabs.name(w.slab) + " bytes " +
                        std::to_string(offset) + " to " + std::to_string(offset + window_size(w)) +
                        "): " + got.why_not;
        found = windows.emplace(w, std::move(got)).first;
      }
      const PageCacheRegistry::Acquired& got = found->second;
      const std::uint64_t length = total(*r);
      if (!got.lease || r->offset + length > got.lease.offset() + got.lease.size()) {
        r->route_reason = got.lease ? "the block runs past its window" : got.why_not;
        rest.push_back(r);
        continue;
      }
      Served s;
      s.request = r;
      s.lease = got.lease.share();
      s.source = got.lease.data() + (r->offset - got.lease.offset());
      s.length = length;
      s.reason = got.registered_now
                     ? "copied from the page cache's registered pages (its window registered by "
                       "this get in " + milliseconds(got.register_seconds) + ")"
                     : "copied from the page cache's registered pages (its window registered "
                       "earlier)";
      served.push_back(std::move(s));
    }
  }

  // Every copy queued first (host memory: copied here), each block's end marked per device.
  std::map<int, std::unique_ptr<Copier>> gpu_copiers;
  std::unique_ptr<Copier> host_copier;
  for (Served& s : served) {
    try {
      std::uint64_t at = 0;
      std::map<int, bool> used;
      for (const BlockSpan& p : s.request->pieces) {
        if (p.size == 0) continue;
        Copier* copier;
        if (p.device.is_cuda()) {
          auto& c = gpu_copiers[p.device.index];
          if (!c) c = make_copier(p.device, 1);
          copier = c.get();
          used[p.device.index] = true;
        } else {
          if (!host_copier) host_copier = make_copier(p.device, 1);
          copier = host_copier.get();
        }
        copier->put(reinterpret_cast<std::uintptr_t>(p.data), s.source + at, p.size);
        at += p.size;
      }
      for (const auto& [ordinal, yes] : used)
        s.ends.emplace_back(ordinal, gpu_copiers[ordinal]->mark_end());
    } catch (const std::exception& e) {
      s.failure = e.what();
      s.verdict = Served::Verdict::failed;
    }
  }
  // Then each block hashed from the mapping once its copies completed.
  verify_all(served);
  for (auto& [ordinal, copier] : gpu_copiers) copier->drain();  // failed blocks' copies too

  std::set<Window> stale;
  std::vector<BlockRequest*> reread;
  std::uint64_t verified = 0;
  for (Served& s : served) {
    BlockRequest& r = *s.request;
    switch (s.verdict) {
      case Served::Verdict::match:
        r.outcome = BlockOutcome::ok;
        r.route = KVRoute::page_cache_dma;
        r.route_reason = std::move(s.reason);
        verified += s.length;
        break;
      case Served::Verdict::mismatch:
        // Stale pages (another process wrote the slot) or a bad slab: the file decides.
        stale.insert(window_of(r));
        reread.push_back(&r);
        r.route_reason =
            "page-cache DMA found its window stale (a checksum mismatch): the window was "
            "dropped and the block re-read from the file";
        rest.push_back(&r);
        break;
      case Served::Verdict::failed:
      case Served::Verdict::pending:
        r.route_reason = "the copy from the page cache failed: " + s.failure;
        rest.push_back(&r);
        break;
    }
  }
  if (!stale.empty()) {
    served.clear();  // this get's leases go first: release() waits for the last one
    for (const Window& w : stale) release(w);
    // Pages the write could not replace while pinned are stale in the page cache too: dropped
    // (clean pages), so the re-read goes to the file.
    for (BlockRequest* r : reread)
      drop_cached_range(_slabs.buffered_fd(r->slab), r->offset, _slot_bytes);
  }
  std::lock_guard lock(_mutex);
  _counters.bytes += verified;
  _counters.stale_rereads += reread.size();
  return rest;
}

PageCacheCounters PageCacheGets::counters() const {
  std::lock_guard lock(_mutex);
  return _counters;
}

}  // namespace ferry::detail::kv
