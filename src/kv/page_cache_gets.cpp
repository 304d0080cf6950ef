#include "kv/page_cache_gets.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <set>
#include <string>

#include "cuda/cuda_resources.hpp"
#include "cuda/gpu_checksum.hpp"
#include "ferry/error.hpp"
#include "kv/checksum.hpp"
#include "platform/file_ranges.hpp"
#include "services/page_cache_registry.hpp"

namespace ferry::detail::kv {
namespace {

// A chunk's copies, then its checksums, go on one stream while the next chunk's copies go on
// the other, all queued at once (the host waits once per get). A get is cut in about
// kChunksPerGet chunks so that even a small one overlaps its DMA with its checksums, each between
// kMinChunkBytes (a chunk's fixed costs, a few launches and events, stay small beside its DMA)
// and kMaxChunkBytes (a bounce buffer's size for per-layer pieces).
constexpr std::uint64_t kMinChunkBytes = 4ull << 20, kMaxChunkBytes = 32ull << 20;
constexpr std::uint64_t kChunksPerGet = 4;
constexpr std::uint64_t kBounceAlign = 256;  // a gathered block's start in the bounce buffer
constexpr int kHost = -1;                    // "ordinal" of host memory (tests' stand-ins)

// The block's one piece with bytes, or null where it has several (they land in a bounce
// buffer, then are scattered) or none.
const BlockSpan* only_piece(const BlockRequest& r) {
  const BlockSpan* only = nullptr;
  for (const BlockSpan& p : r.pieces) {
    if (p.size == 0) continue;
    if (only) return nullptr;
    only = &p;
  }
  return only;
}

// The device all the block's bytes go to (kHost for host memory); false where its pieces lie on
// several (a block is verified where it lands, on one device) or it has no bytes.
bool one_device(const BlockRequest& r, int& ordinal) {
  bool found = false;
  for (const BlockSpan& p : r.pieces) {
    if (p.size == 0) continue;
    const int here = p.device.is_cuda() ? p.device.index : kHost;
    if (found && here != ordinal) return false;
    ordinal = here;
    found = true;
  }
  return found;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

// A block served from a window: its lease (held until its copies are done), where its bytes sit
// in the mapping, and what the checksum of the bytes that landed found.
struct PageCacheGets::Served {
  BlockRequest* request = nullptr;
  PageCacheRegistry::Lease lease;
  const std::byte* source = nullptr;
  std::uint64_t length = 0;
  int ordinal = kHost;
  std::string reason;
  enum class Verdict { pending, match, mismatch, failed } verdict = Verdict::pending;
  std::string failure;  // where failed: why, for the usual path's reason
};

// Per device: two lanes (a stream each, its bounce buffer for multi-piece blocks and its
// checksum scratch), used by one get at a time.
struct PageCacheGets::Lanes {
  struct Lane {
    Stream stream;
    std::shared_ptr<void> bounce;
    std::uint64_t bounce_bytes = 0;
    GpuChecksumScratch scratch;
  };
  HostBuffer digests;  // pinned: where every chunk's digests land
  explicit Lanes(int ordinal) : context(std::make_shared<PrimaryContext>(ordinal)) {}
  std::shared_ptr<PrimaryContext> context;  // first: outlives the streams
  std::mutex mutex;
  std::vector<std::unique_ptr<Lane>> lanes;  // two, made at first use
};

PageCacheGets::PageCacheGets(const SlabFiles& slabs, std::uint64_t slot_bytes,
                             std::uint64_t slab_bytes, std::uint64_t budget_bytes)
    : _slabs(slabs),
      _slot_bytes(slot_bytes),
      _slab_bytes(slab_bytes),
      _window_bytes(std::max<std::uint64_t>(1, kWindowTarget / slot_bytes) * slot_bytes),
      _budget(budget_bytes),
      _registrar([this](const WindowRegistrar::Window& w) {
        return register_window({w.first, w.second});
      }) {
  for (unsigned i = 0; i < slabs.count(); ++i)
    _files.push_back(PlatformFile::open(slabs.path(static_cast<int>(i)), FileAccess::Read, false));
}

PageCacheGets::~PageCacheGets() = default;

std::uint64_t PageCacheGets::window_size(const Window& w) const {
  const std::uint64_t offset = w.index * _window_bytes;
  return std::min(_window_bytes, _slab_bytes - std::min(offset, _slab_bytes));
}

void PageCacheGets::release(const Window& w) {
  page_cache_registry().release_range(_files[w.slab].identity(), w.index * _window_bytes,
                                      window_size(w), true);
}

PageCacheGets::Lanes& PageCacheGets::lanes(int ordinal) {
  std::lock_guard lock(_mutex);
  auto& l = _lanes[ordinal];
  if (!l) l = std::make_unique<Lanes>(ordinal);
  return *l;
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
  // No get takes these windows from here on, and none is registered in the background; those
  // registered go once their gets let go.
  _registrar.hold(guard._windows);
  for (const auto& [slab, index] : guard._windows) release({slab, index});
  return guard;
}

PageCacheGets::Writing::~Writing() {
  if (!_owner) return;
  _owner->_registrar.unhold(_windows);
  std::lock_guard lock(_owner->_mutex);
  for (const auto& [slab, index] : _windows) {
    auto it = _owner->_writing.find({slab, index});
    if (it != _owner->_writing.end() && --it->second == 0) _owner->_writing.erase(it);
  }
}

// Blocks of one get queued together on one lane: copies, then checksums, then scatters.
struct PageCacheGets::Chunk {
  std::span<Served* const> blocks;
  std::uint64_t bytes = 0;
  std::uint64_t* digests = nullptr;  // in the pinned buffer, one per block
  Event start{true}, copied{true}, hashed{true}, scattered{true};
  bool queued = false;
};

namespace {

// A served block as queueing it sees it: the request, its window's mapping, its bytes there.
struct Block {
  const BlockRequest* request = nullptr;
  const std::byte* window = nullptr;
  const std::byte* source = nullptr;
  std::uint64_t length = 0;
};

// Where each block of a chunk lands in the lane's bounce buffer (multi-piece blocks; 0 for the
// others), and the bytes the buffer needs.
std::vector<std::uint64_t> bounce_offsets(std::span<const Block> blocks, std::uint64_t& need) {
  need = 0;
  std::vector<std::uint64_t> at(blocks.size(), 0);
  for (std::size_t i = 0; i < blocks.size(); ++i)
    if (!only_piece(*blocks[i].request)) {
      at[i] = need;
      need += (blocks[i].length + kBounceAlign - 1) / kBounceAlign * kBounceAlign;
    }
  return at;
}

// What the GPU checks of a chunk: where each block's bytes land, the checksum each must have,
// and the scatters of the multi-piece blocks out of the bounce buffer (run where they matched).
struct Landing {
  std::vector<DeviceBytes> landed;
  std::vector<std::uint64_t> expected;
  std::vector<MatchedCopy> scatter;
};

Landing landing(std::span<const Block> blocks, shim::cu::DevicePtr bounce,
                std::span<const std::uint64_t> at) {
  Landing out;
  out.landed.resize(blocks.size());
  out.expected.resize(blocks.size());
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const BlockRequest& r = *blocks[i].request;
    const BlockSpan* only = only_piece(r);
    out.landed[i] = {only ? reinterpret_cast<shim::cu::DevicePtr>(only->data) : bounce + at[i],
                     blocks[i].length};
    out.expected[i] = r.checksum;
    if (only) continue;
    shim::cu::DevicePtr from = bounce + at[i];
    for (const BlockSpan& p : r.pieces) {
      if (p.size == 0) continue;
      out.scatter.push_back({from, reinterpret_cast<shim::cu::DevicePtr>(p.data), p.size, i});
      from += p.size;
    }
  }
  return out;
}

// Blocks next to each other in one window that land next to each other (consecutive slots into
// consecutive destinations, or into the bounce buffer) go in one copy.
void queue_copies(std::span<const Block> blocks, std::span<const DeviceBytes> landed,
                  shim::cu::Stream stream) {
  for (std::size_t i = 0; i < blocks.size();) {
    const Block& first = blocks[i];
    std::uint64_t bytes = first.length;
    std::size_t next = i + 1;
    for (; next < blocks.size(); ++next) {
      const Block& b = blocks[next];
      if (b.window != first.window || b.source != first.source + bytes ||
          landed[next].data != landed[i].data + bytes)
        break;
      bytes += b.length;
    }
    FERRY_CU(cuMemcpyHtoDAsync, landed[i].data, first.source, bytes, stream);
    i = next;
  }
}

}  // namespace

std::vector<std::unique_ptr<PageCacheGets::Chunk>> PageCacheGets::cut_in_chunks(
    std::span<Served* const> blocks, std::uint64_t* digests) {
  std::uint64_t get_bytes = 0;
  for (const Served* s : blocks) get_bytes += s->length;
  const std::uint64_t chunk_bytes =
      std::clamp(get_bytes / kChunksPerGet, kMinChunkBytes, kMaxChunkBytes);
  std::vector<std::unique_ptr<Chunk>> chunks;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    if (chunks.empty() || chunks.back()->bytes >= chunk_bytes) {
      chunks.push_back(std::make_unique<Chunk>());
      chunks.back()->blocks = blocks.subspan(i, 0);
      chunks.back()->digests = digests + i;
    }
    Chunk& c = *chunks.back();
    c.blocks = blocks.subspan(i - c.blocks.size(), c.blocks.size() + 1);
    c.bytes += blocks[i]->length;
  }
  return chunks;
}

// On the chunk's stream: the copies out of the page cache, into each block's destination or
// the lane's bounce buffer; the checksums of the bytes where they landed; the scatter of the
// multi-piece blocks that matched, decided on the GPU (the others' pieces are left untouched).
void PageCacheGets::queue_chunk(int ordinal, Lanes& device, std::size_t lane_index, Chunk& c) {
  Lanes::Lane& lane = *device.lanes[lane_index];
  std::vector<Block> blocks;
  for (const Served* s : c.blocks)
    blocks.push_back({s->request, s->lease.data(), s->source, s->length});
  std::uint64_t need = 0;
  const std::vector<std::uint64_t> at = bounce_offsets(blocks, need);
  if (need > lane.bounce_bytes) {
    lane.stream.synchronize();  // the chunk before on this lane scatters from it
    lane.bounce.reset();
    lane.bounce_bytes = 0;
    lane.bounce = allocate_device_memory(device.context, need);
    lane.bounce_bytes = need;
  }
  const Landing l = landing(blocks, reinterpret_cast<shim::cu::DevicePtr>(lane.bounce.get()), at);
  c.start.record(lane.stream);
  queue_copies(blocks, l.landed, lane.stream.get());
  c.copied.record(lane.stream);
  queue_gpu_checksums(ordinal, l.landed, lane.stream.get(), lane.scratch, c.digests, l.expected,
                      l.scatter, [&] { c.hashed.record(lane.stream); });
  c.scattered.record(lane.stream);
  c.queued = true;
}

void PageCacheGets::fail(std::span<Served* const> blocks, const std::exception& e) {
  for (Served* s : blocks) {
    s->verdict = Served::Verdict::failed;
    s->failure = e.what();
  }
}

void PageCacheGets::land_on_gpu(int ordinal, std::span<Served* const> blocks, Times& times) {
  Lanes& device = lanes(ordinal);
  std::lock_guard lock(device.mutex);
  RelaxedCaptureMode relaxed;  // our own streams' waits: never part of another thread's capture
  device.context->make_current();
  while (device.lanes.size() < 2) device.lanes.push_back(std::make_unique<Lanes::Lane>());
  if (device.digests.size() < blocks.size() * sizeof(std::uint64_t))
    device.digests = HostBuffer(blocks.size() * sizeof(std::uint64_t), device.context.get());
  const std::vector<std::unique_ptr<Chunk>> chunks =
      cut_in_chunks(blocks, reinterpret_cast<std::uint64_t*>(device.digests.data()));
  // Whatever happens, no copy into a destination (or out of a leased window) is still running
  // when this returns: the usual path may rewrite the destination, the leases may go.
  struct Drain {
    Lanes& device;
    ~Drain() {
      for (auto& lane : device.lanes) try {
          lane->stream.synchronize();
        } catch (const std::exception&) {
          // A broken context: the usual path reports it for the blocks it re-reads.
        }
    }
  } drain{device};
  for (std::size_t k = 0; k < chunks.size(); ++k) {
    try {
      queue_chunk(ordinal, device, k % 2, *chunks[k]);
    } catch (const std::exception& e) {
      fail(chunks[k]->blocks, e);  // not queued whole: its blocks are re-read on the usual path
    }
  }
  try {
    for (auto& lane : device.lanes) lane->stream.synchronize();
  } catch (const std::exception& e) {
    fail(blocks, e);  // a copy or scatter failed after it was queued: no block is trusted
    return;
  }
  for (const auto& c : chunks) {
    if (!c->queued) continue;
    for (std::size_t i = 0; i < c->blocks.size(); ++i)
      c->blocks[i]->verdict = c->digests[i] == c->blocks[i]->request->checksum
                                  ? Served::Verdict::match
                                  : Served::Verdict::mismatch;
    times.dma += Event::elapsed_seconds(c->start, c->copied);
    times.checksum += Event::elapsed_seconds(c->copied, c->hashed);
    times.scatter += Event::elapsed_seconds(c->hashed, c->scattered);
  }
}

void PageCacheGets::land_in_host(std::span<Served* const> blocks, Times& times) {
  std::vector<std::byte> bounce;
  for (Served* s : blocks) {
    try {
      const BlockSpan* only = only_piece(*s->request);
      std::byte* landed = only ? static_cast<std::byte*>(only->data) : nullptr;
      if (!landed) {
        bounce.resize(s->length);
        landed = bounce.data();
      }
      auto start = std::chrono::steady_clock::now();
      std::memcpy(landed, s->source, s->length);
      times.dma += seconds_since(start);
      start = std::chrono::steady_clock::now();
      const bool same = checksum(landed, s->length) == s->request->checksum;
      times.checksum += seconds_since(start);
      s->verdict = same ? Served::Verdict::match : Served::Verdict::mismatch;
      if (!same || only) continue;
      start = std::chrono::steady_clock::now();
      const std::byte* from = landed;
      for (const BlockSpan& p : s->request->pieces) {
        std::memcpy(p.data, from, p.size);
        from += p.size;
      }
      times.scatter += seconds_since(start);
    } catch (const std::exception& e) {
      s->verdict = Served::Verdict::failed;
      s->failure = e.what();
    }
  }
}

// Why `r` cannot take page-cache DMA ("" where it can), and the device it goes to. Under _mutex.
std::string PageCacheGets::why_not_served(const BlockRequest& r, int& ordinal,
                                          std::map<int, std::string>& no_checksum) const {
  const PageCacheRegistry& registry = page_cache_registry();
  ordinal = kHost;
  if (!one_device(r, ordinal))
    return "its pieces lie on more than one device (page-cache DMA verifies a block where it "
           "lands, on one device)";
  const Device device = ordinal == kHost ? Device::cpu() : Device::cuda(ordinal);
  if (!registry.serves(device))
    return device.is_cuda() ? "page-cache DMA (" + registry.registrar_name() +
                                  ") does not serve " + device.to_string()
                            : "its destination is host memory (page-cache DMA serves GPU memory)";
  if (device.is_cuda()) {
    auto why = no_checksum.find(ordinal);
    if (why == no_checksum.end())
      why = no_checksum.emplace(ordinal, gpu_checksum_unavailable(ordinal)).first;
    if (!why->second.empty())
      return "page-cache DMA needs the GPU checksum to verify the bytes that land on " +
             device.to_string() + ": " + why->second;
  }
  if (_writing.count(window_of(r))) return "a put is writing into its window";
  return {};
}

namespace {

std::string served_reason(bool cuda) {
  return std::string("copied from the page cache's registered pages") +
         (cuda ? ", checked where it landed by the GPU checksum" : ", checked where it landed");
}

}  // namespace

std::string PageCacheGets::not_registered(const Window& w) {
  const std::uint64_t offset = w.index * _window_bytes;
  const std::string where = "its window (" + _slabs.name(w.slab) + " bytes " +
                            std::to_string(offset) + " to " +
                            std::to_string(offset + window_size(w)) + ")";
  if (window_size(w) > _budget)
    return where + ": larger than the budget (" + std::to_string(_budget) + " bytes)";
  // A sample of its pages first: a window that is not resident is not worth a try.
  if (!range_resident_sampled(_slabs.buffered_fd(w.slab), offset, window_size(w), 16))
    return where + ": not fully in the page cache";
  _registrar.request({w.slab, w.index});
  const std::string refused = _registrar.refusal({w.slab, w.index});
  if (!refused.empty())
    return where + " could not be registered (" + refused + "); trying again in the background";
  return where + " is in the page cache but not registered yet: registering it in the "
                 "background for later gets (a get never waits for a registration)";
}

std::string PageCacheGets::register_window(const Window& w) {
  auto got = page_cache_registry().acquire_window(_files[w.slab], w.index * _window_bytes,
                                                  window_size(w), _budget);
  std::lock_guard lock(_mutex);
  if (got.registered_now) {
    ++_counters.registered;
    _counters.register_seconds += got.register_seconds;
  }
  return got.lease ? std::string() : got.why_not;
}

// Leases of this get, one registry lookup per window (never a registration: those run in the
// background); under the lock that writing() marks windows under.
std::vector<PageCacheGets::Served> PageCacheGets::take_windows(
    std::span<BlockRequest* const> blocks, std::vector<BlockRequest*>& rest) {
  PageCacheRegistry& registry = page_cache_registry();
  std::vector<Served> served;
  served.reserve(blocks.size());
  std::map<int, std::string> no_checksum;  // per device: why the GPU checksum cannot run
  std::map<Window, PageCacheRegistry::Acquired> windows;
  std::lock_guard lock(_mutex);
  for (BlockRequest* r : blocks) {
    const auto refuse = [&](std::string why) {
      r->route_reason = std::move(why);
      rest.push_back(r);
    };
    int ordinal = kHost;
    if (std::string why = why_not_served(*r, ordinal, no_checksum); !why.empty()) {
      refuse(std::move(why));
      continue;
    }
    const Window w = window_of(*r);
    auto found = windows.find(w);
    if (found == windows.end()) {
      auto got = registry.find_window(_files[w.slab], w.index * _window_bytes, window_size(w));
      if (!got.lease) got.why_not = not_registered(w);
      found = windows.emplace(w, std::move(got)).first;
    }
    const PageCacheRegistry::Acquired& got = found->second;
    const std::uint64_t length = request_bytes(*r);
    if (!got.lease || r->offset + length > got.lease.offset() + got.lease.size()) {
      refuse(got.lease ? "the block runs past its window" : got.why_not);
      continue;
    }
    Served s;
    s.request = r;
    s.lease = got.lease.share();
    s.source = got.lease.data() + (r->offset - got.lease.offset());
    s.length = length;
    s.ordinal = ordinal;
    s.reason = served_reason(ordinal != kHost);
    served.push_back(std::move(s));
  }
  return served;
}

// Each device's blocks copied and checked where they landed (host memory: tests' stand-ins).
PageCacheGets::Times PageCacheGets::land(std::vector<Served>& served) {
  std::map<int, std::vector<Served*>> by_device;
  for (Served& s : served) by_device[s.ordinal].push_back(&s);
  Times times;
  for (auto& [ordinal, group] : by_device) {
    try {
      if (ordinal == kHost)
        land_in_host(group, times);
      else
        land_on_gpu(ordinal, group, times);
    } catch (const std::exception& e) {
      for (Served* s : group)
        if (s->verdict == Served::Verdict::pending) {
          s->verdict = Served::Verdict::failed;
          s->failure = e.what();
        }
    }
  }
  return times;
}

// Each served block's outcome: done where it matched, else back to `rest` for the usual path;
// a mismatch's window is dropped (after this get's leases) and its pages with it.
void PageCacheGets::settle(std::vector<Served>& served, std::vector<BlockRequest*>& rest,
                           const Times& times) {
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
        // Stale pinned pages (another process wrote the slot) or a bad slab: the file decides.
        stale.insert(window_of(r));
        reread.push_back(&r);
        r.route_reason =
            "page-cache DMA found its window stale (the checksum of the bytes that landed "
            "differs): the window was dropped and the block re-read from the file";
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
  _counters.dma_seconds += times.dma;
  _counters.checksum_seconds += times.checksum;
  _counters.scatter_seconds += times.scatter;
}

std::vector<BlockRequest*> PageCacheGets::read(std::span<BlockRequest* const> blocks) {
  std::vector<BlockRequest*> rest;
  std::vector<Served> served = take_windows(blocks, rest);
  const Times times = land(served);
  settle(served, rest, times);
  return rest;
}

PageCacheCounters PageCacheGets::counters() const {
  std::lock_guard lock(_mutex);
  PageCacheCounters out = _counters;
  out.pending = _registrar.pending();
  return out;
}

}  // namespace ferry::detail::kv
