#include "kv/transfer_block_io.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <optional>
#include <thread>

#include "cuda/cuda_resources.hpp"
#include "ferry/error.hpp"
#include "ferry/transfer.hpp"
#include "kv/kv_call_support.hpp"
#include "kv/transfer_block_group.hpp"
#include "transfer/backend.hpp"
#include "transfer/staged/staged_settings.hpp"

namespace ferry::detail::kv {
namespace {

// Device bounce memory for a batch's multi-piece blocks, per device, kept between batches: a
// part for each group in flight. The batch goes in groups of kGroupBytes, three in flight: while
// the oldest is waited for, verified and scattered, the next two move, each on half the workers
// (with two in flight, half the workers idled through each group's end and the next one's start:
// a batch of many groups ran at 0.79 x one piece's speed).
constexpr std::uint64_t kGroupBytes = 128ull << 20;
constexpr std::size_t kFlights = 3;
// Gets read through the page cache move at memory speed, where each group's start and end (its
// transfer filling and draining the workers) cost more than the overlap hides: groups of 1 GiB,
// two in flight (vLLM's layout, 1,024 blocks a call on an H200: 0.88-0.90 x one piece's warm get
// against 0.76 x in 128 MiB groups; one group of the whole call on every worker 0.87 x). Their
// transfers' staging slots are the same 4 MiB as the smaller groups' (no re-registration when
// puts, cold gets and warm gets alternate). The bounce buffer grows to two such groups.
constexpr std::uint64_t kCachedGroupBytes = 1ull << 30;
constexpr std::size_t kCachedFlights = 2;

Backend backend_of(KVPath path) {
  switch (path) {
    case KVPath::Staged:
      return Backend::Posix;
    case KVPath::Direct:
      return Backend::Cufile;
    case KVPath::Auto:
      break;
  }
  return Backend::Auto;
}

KVRoute route_of(const TransferStats& stats, int slab) {
  if (stats.backend != "cufile") return KVRoute::staged;
  for (std::size_t f = 0; f < stats.files.size(); ++f)
    if (static_cast<int>(f) == slab && stats.files[f].io_path == IoPath::CufileGds)
      return KVRoute::cufile_gds;
  return KVRoute::cufile_compat;
}

void fail(BlockRequest& r, BlockOutcome outcome, std::string message) {
  r.outcome = outcome;
  r.message = std::move(message);
}

}  // namespace

// A submitted group. Staged: each block's checksum taken by the core's observer from the bytes
// in host staging, in block order, as they pass (no second pass over them); `seen` is declared
// before the ticket, whose destructor waits for the workers that update it. Not movable: the
// observer holds `seen`'s address.
struct TransferBlockIo::Flight {
  Group g;
  std::vector<StreamingHash> seen;
  Ticket ticket;
  Clock::time_point submitted, waited;  // its transfer started; waited for (StagedTimes)
  // The group's scatter tables are made while its transfer runs: a block landing before is
  // scattered after the group instead.
  std::atomic<bool> scatters_ready{false};
  Flight() = default;
  Flight(const Flight&) = delete;
  Flight& operator=(const Flight&) = delete;
};

TransferBlockIo::TransferBlockIo(SlabFiles& slabs, std::uint64_t slot_bytes, bool writable,
                                 KVPath path, bool allow_compat, bool host_through_core,
                                 unsigned threads)
    : _host(slabs, slot_bytes),
      _slabs(slabs),
      _writable(writable),
      _path(path),
      _allow_compat(allow_compat),
      _host_through_core(host_through_core),
      _threads(threads) {}

template <class HostMove, class GpuMove>
void TransferBlockIo::split(std::span<BlockRequest> batch, HostMove&& host, GpuMove&& gpu) {
  std::vector<BlockRequest> host_blocks;
  std::vector<std::size_t> host_index;
  std::vector<BlockRequest*> gpu_blocks;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    if (gpu_of(batch[i]) >= 0 || _host_through_core) {
      gpu_blocks.push_back(&batch[i]);
    } else {
      host_blocks.push_back(batch[i]);
      host_index.push_back(i);
    }
  }
  if (!host_blocks.empty()) {
    host(std::span(host_blocks));
    for (std::size_t h = 0; h < host_blocks.size(); ++h) batch[host_index[h]] = host_blocks[h];
  }
  if (!gpu_blocks.empty()) gpu(gpu_blocks);
}

void TransferBlockIo::enable_page_cache(std::uint64_t budget_bytes, std::uint64_t slot_bytes,
                                        std::uint64_t slab_bytes) {
  _page_cache = std::make_unique<PageCacheGets>(_slabs, slot_bytes, slab_bytes, budget_bytes);
}

PageCacheCounters TransferBlockIo::page_cache_counters() const {
  return _page_cache ? _page_cache->counters() : PageCacheCounters{};
}

void TransferBlockIo::write(std::span<BlockRequest> batch, void* after_event) {
  // Page-cache windows wait to be registered until this put is done (WindowRegistrar::Busy).
  std::optional<WindowRegistrar::Busy> busy;
  if (_page_cache) busy.emplace(_page_cache->registrar());
  // No registered window keeps pages this write replaces (see PageCacheGets).
  const auto writing = _page_cache ? _page_cache->writing(batch) : PageCacheGets::Writing();
  split(
      batch,
      [&](std::span<BlockRequest> b) {
        // Host memory a device copy still fills (a D2H into pinned memory): wait for it here.
        if (after_event) {
          try {
            FERRY_EXPECT(cuda_available(), CudaError, "a producer's event was given, but no CUDA ",
                         "driver is usable here: ", shim::CudaDriver::get().why_unusable);
            FERRY_CU(cuEventSynchronize, static_cast<shim::cu::Event>(after_event));
          } catch (const std::exception& e) {
            for (BlockRequest& r : b)
              fail(r, BlockOutcome::io_error,
                   concat("waiting for the producer's event: ", e.what()));
            return;
          }
        }
        _host.write(b, after_event);
      },
      [&](std::vector<BlockRequest*>& b) { move_gpu(b, true, after_event); });
}

void TransferBlockIo::read(std::span<BlockRequest> batch) {
  if (!_page_cache) return read_moved(batch);
  const WindowRegistrar::Busy busy(_page_cache->registrar());  // as a put's (see write())
  std::vector<BlockRequest*> all(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) all[i] = &batch[i];
  const std::vector<BlockRequest*> rest = _page_cache->read(all);
  if (rest.empty()) return;
  std::vector<BlockRequest> moved;
  for (BlockRequest* r : rest) moved.push_back(*r);
  read_moved(moved);
  for (std::size_t i = 0; i < rest.size(); ++i) *rest[i] = std::move(moved[i]);
}

void TransferBlockIo::read_moved(std::span<BlockRequest> batch) {
  split(
      batch, [&](std::span<BlockRequest> b) { _host.read(b); },
      [&](std::vector<BlockRequest*>& b) { move_gpu(b, false, nullptr); });
}

void TransferBlockIo::share_writes(unsigned writers) {
  _writers.store(std::max(1u, writers));
  _host.share_writes(writers);
}

TransferOptions TransferBlockIo::options(void* after_event) const {
  TransferOptions o;
  o.backend = backend_of(_path);
  o.allow_compat = _allow_compat;
  o.after_event = after_event;
  o.threads = _threads;
  // A batch's blocks are hashed in order each: workers take them round-robin, all busy at once.
  o.interleave = true;
  return o;
}

void TransferBlockIo::move_gpu(std::vector<BlockRequest*>& blocks, bool writing,
                               void* after_event) {
  std::lock_guard lock(_mutex);
  const auto entered = Clock::now();
  bool direct = false;
  try {
    if (!_files) {
      auto files = FileSet::create();
      for (unsigned i = 0; i < _slabs.count(); ++i)
        files->add(_slabs.path(static_cast<int>(i)),
                   _writable ? FileAccess::ReadWrite : FileAccess::Read);
      _files = std::move(files);
    }
    const int gpu = gpu_of(*blocks[0]);
    const Route route =
        choose_route(*_files, gpu >= 0 ? Device::cuda(gpu) : Device::cpu(), options(nullptr));
    direct = route.backend == &cufile_backend();
  } catch (const std::exception& e) {
    for (BlockRequest* b : blocks)
      fail(*b, BlockOutcome::unsupported,
           concat("the ", writing ? "put" : "get", " path cannot run: ", e.what()));
    return;
  }
  // A group's blocks fail together where a step of it throws.
  const auto guarded = [&](std::span<BlockRequest* const> group, const auto& step) {
    try {
      step();
    } catch (const std::exception& e) {
      for (BlockRequest* b : group)
        fail(*b, BlockOutcome::io_error,
             concat(_slabs.name(b->slab), ": block at offset ", b->offset, ": ", e.what()));
    }
  };
  // Later groups are submitted before this one is finished (the core's staging pool bounds
  // them all), the workers shared between them.
  const bool buffered = !writing && reads_buffered(blocks);
  const std::vector<std::span<BlockRequest* const>> groups =
      cut_groups(blocks, direct,
                 _groups.bytes ? _groups.bytes
                 : buffered    ? kCachedGroupBytes
                               : kGroupBytes);
  const std::size_t flights = std::min(groups.size(), _groups.flights ? std::size_t{_groups.flights}
                                                      : buffered      ? kCachedFlights
                                                                      : kFlights);
  const unsigned all_threads = wanted_settings(options(nullptr)).threads;
  // A fleet's writers share the storage: each puts with its share of the workers.
  const unsigned sharing = writing ? _writers.load() : 1u;
  const unsigned threads =
      _groups.threads
          ? _groups.threads
          : std::max<unsigned>(1, (groups.size() > 1 ? all_threads / 2 : all_threads) / sharing);
  try {
    reserve_bounce(groups, direct, flights);
  } catch (const std::exception& e) {
    for (BlockRequest* b : blocks)
      fail(*b, BlockOutcome::io_error, concat("no device bounce buffer: ", e.what()));
    return;
  }
  std::deque<std::unique_ptr<Flight>> in_flight;
  Clock::time_point last_waited;  // the latest transfer's end seen (StagedTimes::tail)
  const auto finish_oldest = [&] {
    Flight& oldest = *in_flight.front();
    guarded(oldest.g.blocks, [&] { finish_group(oldest, after_event); });
    last_waited = std::max(last_waited, oldest.waited);
    in_flight.pop_front();
  };
  for (std::size_t k = 0; k < groups.size(); ++k) {
    std::unique_ptr<Flight> current;
    guarded(groups[k], [&] {
      current =
          start_group(groups[k], writing, direct, buffered, after_event, k % flights, threads);
    });
    if (k == 0 && current) add_time(_times.lead, seconds(entered, current->submitted));
    if (current) in_flight.push_back(std::move(current));
    // The part the next group takes is the oldest's: finish it first.
    if (!in_flight.empty() && in_flight.front()->g.flight == (k + 1) % flights) finish_oldest();
  }
  while (!in_flight.empty()) finish_oldest();
  if (last_waited != Clock::time_point{}) add_time(_times.tail, seconds(last_waited, Clock::now()));
}

void TransferBlockIo::add_time(double& counter, double s) {
  std::lock_guard lock(_times_mutex);
  counter += s;
}

// Whether a get's blocks are all read through the page cache (see group_options).
bool TransferBlockIo::reads_buffered(std::span<BlockRequest* const> blocks) const {
  if (_page_cache) return true;
  std::vector<SlabFiles::Range> ranges(blocks.size());
  for (std::size_t i = 0; i < blocks.size(); ++i)
    ranges[i] = {blocks[i]->slab, blocks[i]->offset, request_bytes(*blocks[i])};
  return _slabs.all_cached(ranges);
}

TransferOptions TransferBlockIo::group_options(const Group& g, void* after_event) const {
  TransferOptions o = options(g.writing ? after_event : nullptr);
  o.threads = g.threads;
  if (g.writing) return o;
  // Gets of blocks all in the page cache read through it (far faster than the device); else
  // around it, whatever the residency of the rest of the slabs. With page-cache DMA on, through
  // it: the pages the read leaves there are what later gets copy straight from (a get around it
  // would leave every window cold, and page-cache DMA would never serve a block).
  o.io = g.buffered ? IoMode::Buffered : _host.direct() ? IoMode::Direct : IoMode::Auto;
  return o;
}

void TransferBlockIo::record_times(const TransferStats& stats) {
  std::lock_guard lock(_times_mutex);
  _times.io += stats.read_thread_seconds;
  _times.copy_wait += stats.wait_thread_seconds;
  _times.queue += stats.queue_thread_seconds;
  _times.setup += stats.setup_thread_seconds;
  _times.hash += stats.observe_thread_seconds;
  _times.hash_wait += stats.observe_wait_thread_seconds;
  _times.transfer += stats.pipeline.done;
  _times.span += stats.pipeline.done * stats.threads;
  _times.copies += stats.copies;
}

void TransferBlockIo::settle(Group& g, const Ticket& ticket) {
  static const std::string staged =
      "through pinned host staging (gpu_path staged, or auto without GPUDirect Storage)";
  static const std::string cufile = "cuFile between GPU memory and the slab";
  const TransferStats& stats = ticket.stats();
  for (std::size_t i = 0; i < g.blocks.size(); ++i) {
    BlockRequest& b = *g.blocks[i];
    b.route = route_of(stats, b.slab);
    add_route_reason(b, b.route == KVRoute::staged ? staged : cufile);
    const ExtentStatus status = ticket.status(i);
    if (status.state != ExtentStatus::State::Done) {
      fail(b, BlockOutcome::io_error,
           concat(_slabs.name(b.slab), ": ", g.writing ? "write" : "read",
                  " of the block at offset ", b.offset,
                  " failed: ", status.error.empty() ? std::string("cancelled") : status.error));
      continue;
    }
    b.outcome = BlockOutcome::ok;
  }
}

std::unique_ptr<TransferBlockIo::Flight> TransferBlockIo::start_group(
    std::span<BlockRequest* const> blocks, bool writing, bool direct, bool buffered,
    void* after_event, std::size_t flight, unsigned threads) {
  auto f = std::make_unique<Flight>();
  Group& g = f->g;
  g.blocks = blocks;
  g.writing = writing;
  g.direct = direct;
  g.buffered = buffered;
  g.flight = flight;
  g.threads = threads;
  place_in_bounce(g);
  if (writing) bounce_copies(g, true, after_event);
  TransferOptions o = group_options(g, after_event);
  if (!direct) {
    f->seen.resize(blocks.size());
    o.observer = [seen = f->seen.data()](std::size_t e, std::uint64_t, const std::byte* data,
                                         std::uint64_t n) { seen[e].update(data, n); };
  }
  // Each bounced block scattered as it lands, once its checksum (the observer's, complete before
  // this call) matched: the scatter of a whole call no longer waits for its end.
  const bool scatters =
      !writing && !direct &&
      std::any_of(g.bounce.begin(), g.bounce.end(), [](auto b) { return b != 0; });
  if (scatters)
    o.extent_copied = [this, f = f.get()](std::size_t i, void* event) {
      if (!f->scatters_ready.load(std::memory_order_acquire)) return;
      const BlockRequest& r = *f->g.blocks[i];
      if (f->g.bounce[i] && f->seen[i].bytes() == request_bytes(r) &&
          f->seen[i].digest() == r.checksum)
        scatter_block(f->g, i, event);
    };
  f->ticket =
      submit(_files, writing ? Direction::MemoryToFile : Direction::FileToMemory, extents_of(g), o);
  f->submitted = Clock::now();
  if (writing && direct) hash_direct_put(g, after_event);
  if (scatters) {
    prepare_scatters(g);  // while the first blocks are read, not before the transfer starts
    f->scatters_ready.store(true, std::memory_order_release);
  }
  return f;
}

void TransferBlockIo::finish_group(Flight& f, void* after_event) {
  Group& g = f.g;
  const auto blocks = g.blocks;
  // The checksums the observer could not take (cuFile; a staged block it did not see whole),
  // from the device-side bytes.
  const auto hash_rest = [&](const std::vector<bool>& candidates, const std::vector<void*>& waits) {
    std::vector<bool> wanted(candidates);
    for (std::size_t i = 0; i < blocks.size(); ++i)
      if (!g.direct && f.seen[i].bytes() == request_bytes(*blocks[i])) wanted[i] = false;
    auto sums = hash_blocks(g.views, wanted, waits);
    for (std::size_t i = 0; i < blocks.size(); ++i)
      if (candidates[i] && !wanted[i]) sums[i] = f.seen[i].digest();
    return sums;
  };
  // cuFile gets: each block hashed once its read ended, while later blocks are still read.
  const std::vector<std::uint64_t> direct_sums =
      !g.writing && g.direct ? hash_direct_get(g, f.ticket) : std::vector<std::uint64_t>{};
  f.ticket.wait();
  f.waited = Clock::now();
  wait_scatters(g);  // those scattered as they landed (queued by now), before anything can throw
  if (g.writing && !g.direct) {
    // Gathered blocks: from the bounce run, filled before the submission (no event to wait for).
    std::vector<void*> waits(blocks.size(), after_event);
    for (std::size_t i = 0; i < blocks.size(); ++i)
      if (g.bounce[i]) waits[i] = nullptr;
    const auto sums = hash_rest(std::vector<bool>(blocks.size(), true), waits);
    for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i]->checksum = sums[i];
  }
  if (!g.direct) record_times(f.ticket.stats());
  settle(g, f.ticket);
  if (g.writing) return;
  std::vector<bool> landed(blocks.size());
  for (std::size_t i = 0; i < blocks.size(); ++i)
    landed[i] = blocks[i]->outcome == BlockOutcome::ok;
  verify(g, landed,
         g.direct ? direct_sums : hash_rest(landed, std::vector<void*>(blocks.size(), nullptr)));
  bounce_copies(g, false, nullptr);  // verified blocks only, their pieces untouched before
}

// The submission's extents: each block's slab and offset, its views' spans.
std::vector<Extent> TransferBlockIo::extents_of(const Group& g) {
  std::vector<Extent> extents(g.blocks.size());
  for (std::size_t i = 0; i < g.blocks.size(); ++i) {
    extents[i].file = static_cast<std::uint32_t>(g.blocks[i]->slab);
    extents[i].file_offset = g.blocks[i]->offset;
    for (const BlockSpan& p : g.views[i]) extents[i].spans.push_back({p.device, p.data, p.size});
  }
  return extents;
}

// A cuFile put's checksums: gathered blocks are ready already; the others wait for the event.
void TransferBlockIo::hash_direct_put(const Group& g, void* after_event) {
  const std::size_t n = g.blocks.size();
  std::vector<void*> waits(n);
  for (std::size_t i = 0; i < n; ++i) waits[i] = g.bounce[i] ? nullptr : after_event;
  const auto sums = hash_blocks(g.views, std::vector<bool>(n, true), waits);
  for (std::size_t i = 0; i < n; ++i) g.blocks[i]->checksum = sums[i];
}

// A cuFile get's checksums, each block's once its read ended.
std::vector<std::uint64_t> TransferBlockIo::hash_direct_get(const Group& g, const Ticket& ticket) {
  const auto ended = [&](std::size_t i) {
    for (;;) {
      const ExtentStatus status = ticket.status(i);
      if (status.state != ExtentStatus::State::Pending)
        return status.state == ExtentStatus::State::Done;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  };
  const std::size_t n = g.blocks.size();
  return hash_blocks(g.views, std::vector<bool>(n, true), std::vector<void*>(n, nullptr), ended);
}

// A get's landed blocks whose bytes do not match their checksum are dropped.
void TransferBlockIo::verify(const Group& g, const std::vector<bool>& landed,
                             const std::vector<std::uint64_t>& sums) {
  for (std::size_t i = 0; i < g.blocks.size(); ++i)
    if (landed[i] && sums[i] != g.blocks[i]->checksum)
      fail(*g.blocks[i], BlockOutcome::checksum_mismatch,
           concat(_slabs.name(g.blocks[i]->slab), ": block at offset ", g.blocks[i]->offset,
                  " fails its checksum; dropped"));
}

StagedTimes TransferBlockIo::staged_times() const {
  std::lock_guard lock(_times_mutex);
  return _times;
}

std::vector<std::uint64_t> TransferBlockIo::hash_blocks(
    const std::vector<std::vector<BlockSpan>>& views, const std::vector<bool>& wanted,
    const std::vector<void*>& after_events, const std::function<bool(std::size_t)>& landed) {
  std::vector<std::uint64_t> sums(views.size(), 0);
  std::atomic<std::size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  const auto work = [&](BlockHasher& hasher) {
    try {
      for (std::size_t i; (i = next.fetch_add(1)) < views.size();)
        if (wanted[i] && (!landed || landed(i))) sums[i] = hasher.hash(views[i], after_events[i]);
    } catch (...) {
      std::lock_guard lock(error_mutex);
      if (!error) error = std::current_exception();
      next = views.size();
    }
  };
  const std::size_t count =
      static_cast<std::size_t>(std::count(wanted.begin(), wanted.end(), true));
  std::vector<std::thread> helpers;
  try {
    for (std::size_t t = 1; t < std::min(_hashers.size(), count); ++t)
      helpers.emplace_back(work, std::ref(_hashers[t]));
  } catch (const std::system_error&) {
    // No more threads: those made (and this one) hash the rest.
  }
  work(_hashers[0]);
  for (auto& t : helpers) t.join();
  if (error) std::rethrow_exception(error);
  return sums;
}

}  // namespace ferry::detail::kv
