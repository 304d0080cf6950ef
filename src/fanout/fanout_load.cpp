// Executes a fanout plan: per round, the reads of files with a registered page-cache mapping as
// copies from it straight into each rank's memory (direct_reads.hpp), the others as one
// transfer-core submission whose extents scatter into every rank's allocation; then the round's
// scatters and all-gather, queued while the next round's reads run (after the direct copies on
// the device, after the staged reads on the host). At most two submissions are in flight, each
// within the staging bound (and all of them within the process's staging limit).
#include "ferry/fanout_load.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "cuda/cuda_resources.hpp"
#include "fanout/collective.hpp"
#include "fanout/direct_reads.hpp"
#include "ferry/error.hpp"
#include "ferry/transfer.hpp"
#include "load/settings.hpp"
#include "load/ticket_wait.hpp"
#include "services/worker_pool.hpp"

namespace ferry {

using Clock = std::chrono::steady_clock;

namespace {

void check_devices(const std::vector<Device>& devices) {
  FERRY_EXPECT(!devices.empty(), std::invalid_argument, "multi-device load: no device given");
  std::set<int> seen;
  const bool cuda = devices.front().is_cuda();
  for (const Device& d : devices) {
    FERRY_EXPECT(d.is_cuda() == cuda, std::invalid_argument,
                 "multi-device load: cpu cannot be mixed with cuda devices");
    FERRY_EXPECT(!cuda || seen.insert(d.index).second, std::invalid_argument,
                 "multi-device load: ", d.to_string(), " is listed twice");
  }
}

// One read becomes one extent: its copies are back to back in the chunk; neighbours that are
// contiguous on the same rank become one span.
std::vector<Extent> resolve(const std::vector<FanoutRead>& reads,
                            const std::vector<std::uintptr_t>& bases,
                            const std::vector<std::uintptr_t>& scratch,
                            const std::vector<Device>& devices) {
  std::vector<Extent> out;
  out.reserve(reads.size());
  for (const FanoutRead& read : reads) {
    Extent x{read.file_index, read.file_offset, {}};
    std::uint64_t at = 0;
    for (const FanoutCopy& c : read.copies) {
      if (c.chunk_offset > at) x.spans.push_back({Device::cpu(), nullptr, c.chunk_offset - at});
      const std::uintptr_t dst = (c.to_scratch ? scratch : bases)[c.rank] + c.dest_offset;
      MemorySpan* last = x.spans.empty() ? nullptr : &x.spans.back();
      if (last && last->data && c.chunk_offset == at && last->device == devices[c.rank] &&
          reinterpret_cast<std::uintptr_t>(last->data) + last->size == dst) {
        last->size += c.size;
      } else {
        x.spans.push_back({devices[c.rank], reinterpret_cast<void*>(dst), c.size});
      }
      at = c.chunk_offset + c.size;
    }
    if (read.size > at) x.spans.push_back({Device::cpu(), nullptr, read.size - at});
    out.push_back(std::move(x));
  }
  return out;
}

std::uint64_t round_read_bytes(const std::vector<FanoutRead>& reads) {
  std::uint64_t bytes = 0;
  for (const FanoutRead& read : reads) bytes += read.size;
  return bytes;
}

// A round's submissions and the bytes each reads.
struct Submitted {
  std::vector<Ticket> tickets;
  std::vector<std::uint64_t> bytes;
};

TransferOptions transfer_options(const LoadOptions& load, const detail::EngineSettings& settings) {
  TransferOptions t;
  t.backend = Backend::Posix;
  t.io = load.io;
  t.threads = settings.threads;
  t.chunk_bytes = settings.chunk_bytes;
  t.slots_per_thread = settings.slots_per_thread;
  t.staging_bytes = load.staging_bytes;
  t.stop_at_first_error = true;
  return t;
}

// Until the round of `ticket` has no read left to hand out: fewer than `tail` of its `total` bytes
// are still to land (each of its threads is on its last read), or it finished.
void wait_for_tail(const Ticket& ticket, std::uint64_t total, std::uint64_t tail) {
  while (ticket.bytes_done() + tail < total && !ticket.wait_for(100e-6)) {
  }
}

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

double RankLoadStats::gigabytes_per_second() const {
  return seconds > 0 ? static_cast<double>(tensor_bytes) / seconds / 1e9 : 0.0;
}

const LoadedShard* LoadedRank::find(std::string_view name) const {
  auto it = _by_name.find(name);
  return it == _by_name.end() ? nullptr : &_tensors[it->second];
}

class FanoutLoader {
 public:
  FanoutLoader(std::shared_ptr<const Checkpoint> checkpoint, const FanoutOptions& options,
               const detail::MapSources& map)
      : _checkpoint(std::move(checkpoint)), _options(options), _map(map) {}

  FanoutLoad run() {
    FERRY_EXPECT(_checkpoint != nullptr, std::invalid_argument, "load: no checkpoint given");
    const std::vector<Device>& devices = _options.devices;
    check_devices(devices);
    FERRY_EXPECT(_options.load.backend != Backend::Cufile, std::invalid_argument,
                 "multi-device load: only the staged path runs (cuFile registers one destination "
                 "per load); use --backend auto or posix");
    const unsigned n = static_cast<unsigned>(devices.size());
    // Declared first so that they are freed last, after tickets and collectives have drained.
    FanoutLoad result;
    std::vector<std::shared_ptr<void>> scratch_memory;  // two banks per rank, for scatters
    // Start-up outside the clock, as CUDA's: a server has its GPUs and NCCL up already.
    std::vector<std::shared_ptr<detail::PrimaryContext>> contexts;
    for (const Device& d : devices) {
      if (!d.is_cuda()) continue;
      prepare_device(d);
      contexts.push_back(std::make_shared<detail::PrimaryContext>(d.index));
    }
    std::unique_ptr<detail::Collective> collective = devices.front().is_cuda() && n > 1
                                                         ? detail::nccl_collective(devices)
                                                         : detail::host_collective(n);
    FanoutStats& stats = result._stats;
    stats.collective = collective->name();
    stats.collective_setup_seconds =
        devices.front().is_cuda() && n > 1 ? detail::last_collective_setup_seconds() : 0;

    const ActiveTuning tuning = detail::tuning_for(_options.load);
    const auto started = Clock::now();
    _started = started;
    const detail::EngineSettings settings = detail::choose_settings(_options.load, tuning);
    FanoutPlanOptions plan_options;
    plan_options.chunk_bytes = settings.chunk_bytes;
    if (_options.round_bytes) plan_options.round_bytes = _options.round_bytes;
    auto plan = std::make_shared<const FanoutPlan>(
        plan_fanout(*_checkpoint, n, _options.rule, _options.load.names, plan_options));
    result._checkpoint = _checkpoint;
    result._plan = plan;

    const auto allocating = Clock::now();
    mark(stats, "planned");
    std::vector<std::uintptr_t> bases;
    std::vector<void*> base_pointers;
    for (unsigned r = 0; r < n; ++r) {
      LoadedRank& rank = result._ranks.emplace_back();
      rank._device = devices[r];
      const std::uint64_t bytes = plan->layouts[r].dest_bytes;
      rank._memory = devices[r].is_cuda() ? detail::allocate_device_memory(contexts[r], bytes)
                                          : detail::allocate_host_memory(bytes);
      bases.push_back(reinterpret_cast<std::uintptr_t>(rank._memory.get()));
      base_pointers.push_back(rank._memory.get());
      for (const ShardPiece& p : plan->layouts[r].pieces) {
        rank._by_name.emplace(p.info->name, rank._tensors.size());
        rank._tensors.push_back({&p, reinterpret_cast<void*>(bases.back() + p.dest_offset)});
      }
    }
    std::vector<std::uintptr_t> scratch;
    for (unsigned r = 0; r < n; ++r) {
      const std::uint64_t bytes = 2 * plan->scratch_bank_bytes[r];
      if (bytes == 0) {
        scratch.push_back(0);
        continue;
      }
      scratch_memory.push_back(devices[r].is_cuda()
                                   ? detail::allocate_device_memory(contexts[r], bytes)
                                   : detail::allocate_host_memory(bytes));
      scratch.push_back(reinterpret_cast<std::uintptr_t>(scratch_memory.back().get()));
    }
    stats.allocate_seconds = std::chrono::duration<double>(Clock::now() - allocating).count();
    mark(stats, "allocated");

    // Files whose page cache the devices DMA from (registered mappings) and the staged rest.
    std::vector<bool> used(_checkpoint->files().size(), false);
    for (const FanoutRound& round : plan->rounds)
      for (const FanoutRead& read : round.reads) used[read.file_index] = true;
    const std::vector<detail::MappedSource> sources =
        _map(*_checkpoint, used, devices, _options.load);
    if (_options.load.page_cache_pin_bytes > 0) mark(stats, "page_cache_mapped");
    std::vector<std::uint64_t> direct_file_bytes(used.size(), 0);
    std::vector<detail::RoundReads> split;
    for (const FanoutRound& round : plan->rounds)
      split.push_back(detail::split_round(round, sources, bases, scratch, n, direct_file_bytes));
    for (const detail::RoundReads& r : split)
      stats.bytes_from_registered_page_cache += r.direct_bytes;
    for (const detail::MappedSource& s : sources)
      stats.page_cache_register_seconds += s.register_seconds;
    std::optional<detail::DirectCopies> direct;  // declared after the memory: drained first
    // Copy streams per GPU for them: --copy-streams, else 4 (a rank's share of a round is cut in
    // parts of at least 64 MiB, one per stream).
    if (stats.bytes_from_registered_page_cache > 0) {
      stats.direct_streams = _options.load.copy_streams ? _options.load.copy_streams : 4;
      direct.emplace(devices, stats.direct_streams);
    }

    // One process reads for every device: all its readers together are the threads N loads
    // would have (per device: given or chosen), split between the rounds that read at once, and,
    // where the engine chose them, no more than the machine's cores: on 2 x H200 (32 cores),
    // replicas loaded in 0.279 s with two rounds of 32 readers, 0.255 s with two of 16 (waiting
    // copies spin, and the page-cache copies compete for the cores and memory). Two submissions
    // in flight fit the process's staging limit. Per round: one submission with every device's
    // threads, or one per reading device with its share (as one process per GPU would run).
    const bool per_device = _options.submissions == FanoutOptions::Submissions::PerDevice;
    const bool at_tail = _options.next_round == FanoutOptions::NextRound::AtTail;
    static const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    unsigned readers = std::min(detail::kMaxWorkerThreads, settings.threads * n);
    if (_options.load.reader_threads == 0) readers = std::min(readers, std::max(cores, n));
    const unsigned reading_at_once = (at_tail ? 1u : 2u) * (per_device ? n : 1u);
    TransferOptions t = transfer_options(_options.load, settings);
    t.threads = std::max(1u, readers / reading_at_once);
    if (!per_device)
      t.staging_bytes = std::max(_options.load.staging_bytes,
                                 std::min(_options.load.staging_bytes * n, staging_limit() / 2));
    auto done = std::make_shared<std::atomic<std::uint64_t>>(0);
    const std::uint64_t total = plan->read_bytes;
    const auto submit_round = [&](const std::vector<FanoutRead>& staged) {
      Submitted s;
      for (unsigned r = 0; r < (per_device ? n : 1u); ++r) {
        std::vector<FanoutRead> reads;
        for (const FanoutRead& read : staged)
          if (!per_device || read.reader == r) reads.push_back(read);
        if (reads.empty()) continue;
        if (_options.load.progress) {
          auto seen = std::make_shared<std::uint64_t>(0);
          t.progress = [done, seen, total, progress = _options.load.progress](std::uint64_t d,
                                                                              std::uint64_t) {
            progress(done->fetch_add(d - *seen) + d - *seen, total);
            *seen = d;
          };
        }
        s.bytes.push_back(round_read_bytes(reads));
        s.tickets.push_back(submit(_checkpoint->shared_file_set(), Direction::FileToMemory,
                                   resolve(reads, bases, scratch, devices), t));
      }
      return s;
    };

    // Round k's reads are submitted before round k-1's gather is queued, so that they overlap.
    stats.next_round = at_tail ? "at-tail" : "eager";
    stats.submissions = per_device ? "per-device" : "per-round";
    const std::uint64_t tail = std::uint64_t{t.threads} * settings.chunk_bytes;
    const auto reading = Clock::now();
    _copied.assign(plan->rounds.size(), std::vector<std::vector<void*>>(n));
    _scattered.assign(plan->rounds.size(), std::vector<void*>(n, nullptr));
    Submitted previous;
    std::size_t previous_round = 0;
    for (std::size_t k = 0; k < plan->rounds.size(); ++k) {
      const detail::RoundReads& reads = split[k];
      // Round k's scratch bank is round k - 2's: its scatters must be done before it is refilled,
      // on the device for direct copies, on the host for staged reads.
      if (k >= 2 && !plan->rounds[k - 2].scatters.empty()) {
        for (unsigned r = 0; r < n && direct; ++r)
          if (reads.direct_to_scratch[r]) direct->after(r, _scattered[k - 2][r]);
        if (reads.staged_to_scratch) collective->wait();
      }
      if (at_tail && k > 0) {
        const auto waiting = Clock::now();
        for (std::size_t i = 0; i < previous.tickets.size(); ++i)
          wait_for_tail(previous.tickets[i], previous.bytes[i], tail);
        stats.phases.loader_wait_seconds += since(waiting);
      }
      for (unsigned r = 0; r < n && direct; ++r)
        if (!reads.direct[r].empty()) _copied[k][r] = direct->queue(r, reads.direct[r]);
      Submitted current = submit_round(reads.staged);
      mark(stats, "round " + std::to_string(k) + " submitted");
      if (k == 0) _round0_submitted = since(_started);
      if (k > 0)
        finish(previous, previous_round, *plan, *collective, base_pointers, scratch, stats);
      previous = std::move(current);
      previous_round = k;
    }
    if (!plan->rounds.empty())
      finish(previous, previous_round, *plan, *collective, base_pointers, scratch, stats);
    if (direct) {
      const auto waiting = Clock::now();
      wait_direct(split, devices, *done, total, *collective, *direct);
      stats.phases.loader_wait_seconds += since(waiting);
    }
    stats.phases.reads_seconds = since(reading);
    mark(stats, "reads_done");
    const auto draining = Clock::now();
    collective->wait();
    stats.phases.tail_seconds = since(draining);
    stats.phases.pool_threads = detail::transfer_workers().threads();
    stats.seconds = std::chrono::duration<double>(Clock::now() - started).count();
    stats.timeline.emplace_back("done", stats.seconds);
    std::stable_sort(stats.timeline.begin(), stats.timeline.end(),
                     [](const auto& a, const auto& b) { return a.second < b.second; });
    stats.collective_seconds = collective->busy_seconds();
    stats.rounds = plan->rounds.size();
    stats.settings_source = settings.source;
    add_direct_files(*_checkpoint, sources, direct_file_bytes, stats);
    for (const auto& f : stats.files) stats.bytes_read += f.bytes_read;
    for (const TensorInfo* seen : selected(*plan)) stats.checkpoint_bytes += seen->size;
    for (unsigned r = 0; r < n; ++r) {
      RankLoadStats rs;
      rs.device = devices[r].to_string();
      rs.tensor_bytes = plan->layouts[r].tensor_bytes;
      rs.link_bytes = plan->link_bytes[r];
      rs.peer_bytes = plan->peer_bytes[r];
      rs.seconds = stats.seconds;
      stats.tensor_bytes += rs.tensor_bytes;
      stats.ranks.push_back(rs);
    }
    return result;
  }

 private:
  static std::vector<const TensorInfo*> selected(const FanoutPlan& plan) {
    std::vector<const TensorInfo*> out;
    if (!plan.layouts.empty())
      for (const ShardPiece& p : plan.layouts.front().pieces) out.push_back(p.info);
    return out;
  }

  // Waits for a round's staged reads (every copy landed) and makes its collectives wait for its
  // direct copies on the device, then queues its scatters and its gather.
  void finish(Submitted& submitted, std::size_t k, const FanoutPlan& plan,
              detail::Collective& collective, const std::vector<void*>& bases,
              const std::vector<std::uintptr_t>& scratch, FanoutStats& stats) {
    const FanoutRound& round = plan.rounds[k];
    for (Ticket& ticket : submitted.tickets) add_stats(ticket, stats);
    mark(stats, "round " + std::to_string(k) + " read");
    // Round 0's start-up (workers, staging, streams): what a first load pays before its reads.
    if (k == 0 && !submitted.tickets.empty())
      add_pipeline_phases(submitted.tickets.front().stats().pipeline, _round0_submitted,
                          stats.timeline, "round 0 ");
    for (unsigned r = 0; r < plan.ranks; ++r)
      for (void* copied : _copied[k][r]) collective.after(r, copied);
    std::vector<detail::Collective::Slice> slices;
    for (const FanoutScatter& sc : round.scatters) {
      slices.clear();
      for (const ScatterPart& p : sc.parts)
        slices.push_back(
            {p.rank, static_cast<std::byte*>(bases[p.rank]) + p.dest_offset, p.row_begin, p.width});
      collective.scatter(sc.reader,
                         reinterpret_cast<const void*>(scratch[sc.reader] + sc.scratch_offset),
                         sc.rows, sc.row_bytes, slices);
    }
    if (!round.scatters.empty())
      for (unsigned r = 0; r < plan.ranks; ++r) _scattered[k][r] = collective.mark(r);
    if (round.gather_bytes_per_rank > 0 && bases.size() > 1)
      collective.all_gather(bases, round.gather_offset, round.gather_bytes_per_rank);
    mark(stats, "round " + std::to_string(k) + " exchanges queued");
  }

  // Until every direct copy landed, round by round: reports progress and stops (once what is
  // queued has drained) where keep_going says so.
  void wait_direct(const std::vector<detail::RoundReads>& split, const std::vector<Device>& devices,
                   std::atomic<std::uint64_t>& done, std::uint64_t total,
                   detail::Collective& collective, detail::DirectCopies& direct) {
    for (std::size_t k = 0; k < split.size(); ++k) {
      for (std::size_t r = 0; r < devices.size(); ++r)
        for (void* copied : _copied[k][r]) {
          detail::device_context(devices[r].index).make_current();
          FERRY_CU(cuEventSynchronize, static_cast<shim::cu::Event>(copied));
        }
      if (split[k].direct_bytes == 0) continue;
      const std::uint64_t now = done.fetch_add(split[k].direct_bytes) + split[k].direct_bytes;
      if (_options.load.progress) _options.load.progress(now, total);
      if (_options.load.keep_going && !_options.load.keep_going()) {
        direct.drain();
        collective.wait();
        detail::fail<Cancelled>("multi-device load: cancelled");
      }
    }
  }

  // The files read by direct copies, and why the others were not.
  static void add_direct_files(const Checkpoint& checkpoint,
                               const std::vector<detail::MappedSource>& sources,
                               const std::vector<std::uint64_t>& bytes, FanoutStats& stats) {
    for (std::size_t i = 0; i < sources.size(); ++i) {
      const detail::MappedSource& s = sources[i];
      const std::filesystem::path& path = checkpoint.files()[i].path;
      if (s.data && bytes[i] > 0) {
        std::erase_if(stats.files, [&](const FileLoadStats& f) { return f.path == path; });
        stats.files.push_back({path, IoPath::PageCacheDma, s.reason, bytes[i]});
      } else if (!s.reason.empty()) {
        for (FileLoadStats& f : stats.files)
          if (f.path == path) f.reason += "; " + s.reason;
      }
    }
  }

  // Waits for one submission (every copy landed) and adds its statistics.
  void add_stats(Ticket& ticket, FanoutStats& stats) {
    const auto waiting = Clock::now();
    detail::wait_for_load(ticket, _options.load);
    stats.phases.loader_wait_seconds += since(waiting);
    const TransferStats& ts = ticket.stats();
    stats.reader_threads = std::max(stats.reader_threads, ts.threads);
    FanoutPhases& p = stats.phases;
    p.read_thread_seconds += ts.read_thread_seconds;
    p.wait_thread_seconds += ts.wait_thread_seconds;
    p.queue_thread_seconds += ts.queue_thread_seconds;
    p.setup_thread_seconds += ts.setup_thread_seconds;
    p.staging_seconds = std::max(p.staging_seconds, ts.staging_seconds);
    stats.chunk_bytes = std::max(stats.chunk_bytes, ts.chunk_bytes);
    for (const FileLoadStats& f : ts.files) {
      auto it = std::find_if(stats.files.begin(), stats.files.end(),
                             [&](const FileLoadStats& g) { return g.path == f.path; });
      if (it == stats.files.end()) {
        stats.files.push_back(f);
      } else if (it->bytes_read == 0) {  // "not touched" by the submissions so far
        *it = f;
      } else {
        it->bytes_read += f.bytes_read;
      }
    }
  }

  void mark(FanoutStats& stats, std::string name) const {
    stats.timeline.emplace_back(std::move(name), since(_started));
  }

  std::shared_ptr<const Checkpoint> _checkpoint;
  const FanoutOptions& _options;
  Clock::time_point _started;
  double _round0_submitted = 0;
  const detail::MapSources& _map;
  // Per round and rank: a CUevent behind the round's direct copies into the rank, and one
  // behind the rank's collectives once the round's scatters were queued (null: none).
  std::vector<std::vector<std::vector<void*>>> _copied;  // per stream of the rank
  std::vector<std::vector<void*>> _scattered;
};

namespace detail {

FanoutLoad load_fanout(std::shared_ptr<const Checkpoint> checkpoint, const FanoutOptions& options,
                       const MapSources& map) {
  return FanoutLoader(std::move(checkpoint), options, map).run();
}

}  // namespace detail

FanoutLoad load_fanout(std::shared_ptr<const Checkpoint> checkpoint, const FanoutOptions& options) {
  return detail::load_fanout(std::move(checkpoint), options, detail::page_cache_sources());
}

FanoutRoundRead start_fanout_round(const Checkpoint& checkpoint, const FanoutPlan& plan,
                                   std::size_t round, unsigned rank, const Device& device,
                                   void* memory, void* scratch, const LoadOptions& options) {
  FERRY_EXPECT(round < plan.rounds.size() && rank < plan.ranks, std::invalid_argument,
               "read_fanout_round: round ", round, " of ", plan.rounds.size(), ", rank ", rank,
               " of ", plan.ranks, " does not exist");
  FERRY_EXPECT(options.backend != Backend::Cufile, std::invalid_argument,
               "multi-device load: only the staged path runs; use backend auto or posix");
  if (device.is_cuda()) prepare_device(device);
  FanoutRoundRead out;
  out._began = Clock::now();
  out._options = options;
  const detail::EngineSettings settings =
      detail::choose_settings(options, detail::tuning_for(options));
  std::vector<FanoutRead> mine;
  for (const FanoutRead& read : plan.rounds[round].reads)
    if (read.reader == rank) mine.push_back(read);
  // Only this rank's entries are read; the others stay zero.
  std::vector<std::uintptr_t> bases(plan.ranks, 0), scratches(plan.ranks, 0);
  std::vector<Device> devices(plan.ranks, device);
  bases[rank] = reinterpret_cast<std::uintptr_t>(memory);
  scratches[rank] = reinterpret_cast<std::uintptr_t>(scratch);
  LoadStats& stats = out._stats;
  stats.device = device.to_string();
  stats.settings_source = settings.source;
  for (const FanoutRead& read : mine)
    for (const FanoutCopy& c : read.copies) stats.tensor_bytes += c.size;
  if (!mine.empty()) {
    TransferOptions t = transfer_options(options, settings);
    t.progress = options.progress;
    // One process per rank: the staged backend copies this rank's reads of files it can lease
    // straight from their registered page cache (one-process loads split the reads themselves).
    t.page_cache_pin_bytes = options.page_cache_pin_bytes;
    out._submitted = since(out._began);
    out._ticket = submit(checkpoint.shared_file_set(), Direction::FileToMemory,
                         resolve(mine, bases, scratches, devices), t);
    out._started = true;
  }
  return out;
}

LoadStats FanoutRoundRead::wait() {
  if (_started) {
    _started = false;
    detail::wait_for_load(_ticket, _options);
    const TransferStats& ts = _ticket.stats();
    _stats.reader_threads = ts.threads;
    _stats.chunk_bytes = ts.chunk_bytes;
    _stats.slots_per_thread = ts.slots_per_thread;
    _stats.staging_bytes = ts.staging_bytes;
    _stats.staging_pinned = ts.staging_pinned;
    _stats.staging_seconds = ts.staging_seconds;
    _stats.setup_thread_seconds = ts.setup_thread_seconds;
    _stats.read_thread_seconds = ts.read_thread_seconds;
    _stats.wait_thread_seconds = ts.wait_thread_seconds;
    _stats.queue_thread_seconds = ts.queue_thread_seconds;
    _stats.pipeline = ts.pipeline;
    _stats.submit_seconds = _submitted + ts.route_seconds;
    _stats.timeline.emplace_back("submitted", _stats.submit_seconds);
    add_pipeline_phases(ts.pipeline, _stats.submit_seconds, _stats.timeline);
    _stats.files = ts.files;
    for (const auto& f : ts.files) _stats.bytes_read += f.bytes_read;
    _stats.bytes_from_registered_page_cache = ts.bytes_from_registered_page_cache;
    _stats.page_cache_register_seconds = ts.page_cache_register_seconds;
  }
  _stats.seconds = std::chrono::duration<double>(Clock::now() - _began).count();
  _stats.timeline.emplace_back("done", _stats.seconds);
  return _stats;
}

LoadStats read_fanout_round(const Checkpoint& checkpoint, const FanoutPlan& plan, std::size_t round,
                            unsigned rank, const Device& device, void* memory, void* scratch,
                            const LoadOptions& options) {
  return start_fanout_round(checkpoint, plan, round, rank, device, memory, scratch, options).wait();
}

}  // namespace ferry
