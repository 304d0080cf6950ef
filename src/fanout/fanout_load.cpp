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
#include "fanout/fanout_reads.hpp"
#include "fanout/machine_readers.hpp"
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
    check_request();
    start_devices();
    const ActiveTuning tuning = detail::tuning_for(_options.load);
    const auto started = Clock::now();
    _started = started;
    plan_load(tuning);
    mark("planned");
    allocate();
    mark("allocated");
    split_rounds();
    choose_readers();
    read_rounds();
    add_totals(started);
    return std::move(_result);
  }

 private:
  const std::vector<Device>& devices() const { return _options.devices; }

  void check_request() const {
    FERRY_EXPECT(_checkpoint != nullptr, std::invalid_argument, "load: no checkpoint given");
    check_devices(devices());
    FERRY_EXPECT(_options.load.backend != Backend::Cufile, std::invalid_argument,
                 "multi-device load: only the staged path runs (cuFile registers one destination "
                 "per load); use --backend auto or posix");
  }

  // Start-up outside the clock, as CUDA's: a server has its GPUs and NCCL up already.
  void start_devices() {
    _n = static_cast<unsigned>(devices().size());
    for (const Device& d : devices()) {
      if (!d.is_cuda()) continue;
      prepare_device(d);
      _contexts.push_back(std::make_shared<detail::PrimaryContext>(d.index));
    }
    const bool nccl = devices().front().is_cuda() && _n > 1;
    _collective = nccl ? detail::nccl_collective(devices()) : detail::host_collective(_n);
    FanoutStats& stats = _result._stats;
    stats.collective = _collective->name();
    stats.collective_setup_seconds = nccl ? detail::last_collective_setup_seconds() : 0;
  }

  void plan_load(const ActiveTuning& tuning) {
    _settings = detail::choose_settings(_options.load, tuning);
    FanoutPlanOptions plan_options;
    plan_options.chunk_bytes = _settings.chunk_bytes;
    if (_options.round_bytes) plan_options.round_bytes = _options.round_bytes;
    _plan = std::make_shared<const FanoutPlan>(
        plan_fanout(*_checkpoint, _n, _options.rule, _options.load.names, plan_options));
    _result._checkpoint = _checkpoint;
    _result._plan = _plan;
  }

  std::shared_ptr<void> allocate_on(unsigned rank, std::uint64_t bytes) const {
    return devices()[rank].is_cuda() ? detail::allocate_device_memory(_contexts[rank], bytes)
                                     : detail::allocate_host_memory(bytes);
  }

  // Each rank's destination (its tensors' addresses) and two scratch banks for its scatters.
  void allocate() {
    const auto allocating = Clock::now();
    for (unsigned r = 0; r < _n; ++r) {
      LoadedRank& rank = _result._ranks.emplace_back();
      rank._device = devices()[r];
      rank._memory = allocate_on(r, _plan->layouts[r].dest_bytes);
      _bases.push_back(reinterpret_cast<std::uintptr_t>(rank._memory.get()));
      _base_pointers.push_back(rank._memory.get());
      for (const ShardPiece& p : _plan->layouts[r].pieces) {
        rank._by_name.emplace(p.info->name, rank._tensors.size());
        rank._tensors.push_back({&p, reinterpret_cast<void*>(_bases.back() + p.dest_offset)});
      }
    }
    for (unsigned r = 0; r < _n; ++r) {
      const std::uint64_t bytes = 2 * _plan->scratch_bank_bytes[r];
      if (bytes == 0) {
        _scratch.push_back(0);
        continue;
      }
      _scratch_memory.push_back(allocate_on(r, bytes));
      _scratch.push_back(reinterpret_cast<std::uintptr_t>(_scratch_memory.back().get()));
    }
    _result._stats.allocate_seconds = since(allocating);
  }

  // Files whose page cache the devices DMA from (registered mappings) and the staged rest.
  void split_rounds() {
    FanoutStats& stats = _result._stats;
    std::vector<bool> used(_checkpoint->files().size(), false);
    for (const FanoutRound& round : _plan->rounds)
      for (const FanoutRead& read : round.reads) used[read.file_index] = true;
    _sources = _map(*_checkpoint, used, devices(), _options.load);
    if (_options.load.page_cache_pin_bytes > 0) mark("page_cache_mapped");
    _direct_file_bytes.assign(used.size(), 0);
    for (const FanoutRound& round : _plan->rounds)
      _split.push_back(
          detail::split_round(round, _sources, _bases, _scratch, _n, _direct_file_bytes));
    for (const detail::RoundReads& r : _split)
      stats.bytes_from_registered_page_cache += r.direct_bytes;
    for (const detail::MappedSource& s : _sources)
      stats.page_cache_register_seconds += s.register_seconds;
    // Copy streams per GPU for them: --copy-streams, else 4 (a rank's share of a round is cut in
    // parts of at least 64 MiB, one per stream).
    if (stats.bytes_from_registered_page_cache > 0) {
      stats.direct_streams = _options.load.copy_streams ? _options.load.copy_streams : 4;
      _direct.emplace(devices(), stats.direct_streams);
    }
  }

  // One process reads for every device: given threads are per device; where the engine chose
  // them, the machine's readers (machine_readers.hpp: from the page cache one load's per device,
  // at most the cores, since on 2 x H200 (32 cores) replicas loaded in 0.279 s with two rounds
  // of 32 readers and 0.255 s with two of 16; from storage a fixed depth, the device being
  // one). Split between the rounds that read at once; two submissions in flight fit the
  // process's staging limit. Per round: one submission with every device's threads, or one per
  // reading device with its share (as one process per GPU would run).
  void choose_readers() {
    _per_device = _options.submissions == FanoutOptions::Submissions::PerDevice;
    _at_tail = _options.next_round == FanoutOptions::NextRound::AtTail;
    static const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    const unsigned rounds_at_once = _at_tail ? 1u : 2u;
    const unsigned submissions = _per_device ? _n : 1u;  // per round
    _transfer = detail::transfer_options(_options.load, _settings);
    if (_options.load.reader_threads == 0) {
      const bool cached = staged_from_page_cache();
      const detail::ReaderShare share =
          detail::share_readers(_settings.threads, _n, submissions, rounds_at_once, cached, cores);
      _transfer.threads = share.per_submission;
      _readers_note = detail::concat("; ", share.machine, " readers for the ", _n, " devices, ",
                                     share.per_submission, " a submission (reading ",
                                     cached ? "the page cache" : "storage", ")");
    } else {
      const unsigned readers = std::min(detail::kMaxWorkerThreads, _settings.threads * _n);
      _transfer.threads = std::max(1u, readers / (rounds_at_once * submissions));
    }
    if (!_per_device)
      _transfer.staging_bytes =
          std::max(_options.load.staging_bytes,
                   std::min(_options.load.staging_bytes * _n, staging_limit() / 2));
  }

  // Whether the staged reads (those not copied from registered mappings) find their files
  // mostly in the page cache.
  bool staged_from_page_cache() const {
    if (_options.load.io == IoMode::Direct) return false;
    std::set<std::uint32_t> files;
    for (const detail::RoundReads& r : _split)
      for (const FanoutRead& read : r.staged) files.insert(read.file_index);
    const std::vector<std::uint32_t> list(files.begin(), files.end());
    return detail::reads_from_page_cache(_checkpoint->file_set(), list);
  }

  // A round's staged reads: one submission, or one per reading device.
  Submitted submit_round(const std::vector<FanoutRead>& staged) {
    Submitted s;
    const std::uint64_t total = _plan->read_bytes;
    for (unsigned r = 0; r < (_per_device ? _n : 1u); ++r) {
      std::vector<FanoutRead> reads;
      for (const FanoutRead& read : staged)
        if (!_per_device || read.reader == r) reads.push_back(read);
      if (reads.empty()) continue;
      if (_options.load.progress) {
        auto seen = std::make_shared<std::uint64_t>(0);
        _transfer.progress = [done = _done, seen, total, progress = _options.load.progress](
                                 std::uint64_t d, std::uint64_t) {
          progress(done->fetch_add(d - *seen) + d - *seen, total);
          *seen = d;
        };
      }
      s.bytes.push_back(round_read_bytes(reads));
      s.tickets.push_back(submit(_checkpoint->shared_file_set(), Direction::FileToMemory,
                                 detail::resolve(reads, _bases, _scratch, devices()), _transfer));
    }
    return s;
  }

  // Round k's reads are submitted before round k-1's gather is queued, so that they overlap.
  void read_rounds() {
    FanoutStats& stats = _result._stats;
    stats.next_round = _at_tail ? "at-tail" : "eager";
    stats.submissions = _per_device ? "per-device" : "per-round";
    const std::uint64_t tail = std::uint64_t{_transfer.threads} * _settings.chunk_bytes;
    const auto reading = Clock::now();
    const std::size_t rounds = _plan->rounds.size();
    _copied.assign(rounds, std::vector<std::vector<void*>>(_n));
    _scattered.assign(rounds, std::vector<void*>(_n, nullptr));
    Submitted previous;
    for (std::size_t k = 0; k < rounds; ++k) {
      reuse_scratch_bank(k);
      if (_at_tail && k > 0) {
        const auto waiting = Clock::now();
        for (std::size_t i = 0; i < previous.tickets.size(); ++i)
          wait_for_tail(previous.tickets[i], previous.bytes[i], tail);
        stats.phases.loader_wait_seconds += since(waiting);
      }
      for (unsigned r = 0; r < _n && _direct; ++r)
        if (!_split[k].direct[r].empty()) _copied[k][r] = _direct->queue(r, _split[k].direct[r]);
      // Round 0's pipeline times count from its submission's start, not from its return: the
      // reads may be done before submit_round returns.
      if (k == 0) _round0_submitted = since(_started);
      Submitted current = submit_round(_split[k].staged);
      mark("round " + std::to_string(k) + " submitted");
      if (k > 0) finish(previous, k - 1);
      previous = std::move(current);
    }
    if (rounds > 0) finish(previous, rounds - 1);
    if (_direct) {
      const auto waiting = Clock::now();
      wait_direct();
      stats.phases.loader_wait_seconds += since(waiting);
    }
    stats.phases.reads_seconds = since(reading);
    mark("reads_done");
    const auto draining = Clock::now();
    _collective->wait();
    stats.phases.tail_seconds = since(draining);
  }

  // Round k's scratch bank is round k - 2's: its scatters must be done before it is refilled,
  // on the device for direct copies, on the host for staged reads.
  void reuse_scratch_bank(std::size_t k) {
    if (k < 2 || _plan->rounds[k - 2].scatters.empty()) return;
    const detail::RoundReads& reads = _split[k];
    for (unsigned r = 0; r < _n && _direct; ++r)
      if (reads.direct_to_scratch[r]) _direct->after(r, _scattered[k - 2][r]);
    if (reads.staged_to_scratch) _collective->wait();
  }

  void add_totals(Clock::time_point started) {
    FanoutStats& stats = _result._stats;
    stats.phases.pool_threads = detail::transfer_workers().threads();
    stats.seconds = since(started);
    stats.timeline.emplace_back("done", stats.seconds);
    std::stable_sort(stats.timeline.begin(), stats.timeline.end(),
                     [](const auto& a, const auto& b) { return a.second < b.second; });
    stats.collective_seconds = _collective->busy_seconds();
    stats.rounds = _plan->rounds.size();
    stats.settings_source = _settings.source + _readers_note;
    add_direct_files(*_checkpoint, _sources, _direct_file_bytes, stats);
    for (const auto& f : stats.files) stats.bytes_read += f.bytes_read;
    for (const TensorInfo* seen : selected(*_plan)) stats.checkpoint_bytes += seen->size;
    for (unsigned r = 0; r < _n; ++r) {
      RankLoadStats rs;
      rs.device = devices()[r].to_string();
      rs.tensor_bytes = _plan->layouts[r].tensor_bytes;
      rs.link_bytes = _plan->link_bytes[r];
      rs.peer_bytes = _plan->peer_bytes[r];
      rs.seconds = stats.seconds;
      stats.tensor_bytes += rs.tensor_bytes;
      stats.ranks.push_back(rs);
    }
  }

  static std::vector<const TensorInfo*> selected(const FanoutPlan& plan) {
    std::vector<const TensorInfo*> out;
    if (!plan.layouts.empty())
      for (const ShardPiece& p : plan.layouts.front().pieces) out.push_back(p.info);
    return out;
  }

  // Waits for a round's staged reads (every copy landed) and makes its collectives wait for its
  // direct copies on the device, then queues its scatters and its gather.
  void finish(Submitted& submitted, std::size_t k) {
    const FanoutRound& round = _plan->rounds[k];
    detail::Collective& collective = *_collective;
    for (Ticket& ticket : submitted.tickets) add_stats(ticket, _result._stats);
    mark("round " + std::to_string(k) + " read");
    // Round 0's start-up (workers, staging, streams): what a first load pays before its reads.
    if (k == 0 && !submitted.tickets.empty())
      add_pipeline_phases(submitted.tickets.front().stats().pipeline, _round0_submitted,
                          _result._stats.timeline, "round 0 ");
    for (unsigned r = 0; r < _plan->ranks; ++r)
      for (void* copied : _copied[k][r]) collective.after(r, copied);
    std::vector<detail::Collective::Slice> slices;
    for (const FanoutScatter& sc : round.scatters) {
      slices.clear();
      for (const ScatterPart& p : sc.parts)
        slices.push_back({p.rank, static_cast<std::byte*>(_base_pointers[p.rank]) + p.dest_offset,
                          p.row_begin, p.width});
      collective.scatter(sc.reader,
                         reinterpret_cast<const void*>(_scratch[sc.reader] + sc.scratch_offset),
                         sc.rows, sc.row_bytes, slices);
    }
    if (!round.scatters.empty())
      for (unsigned r = 0; r < _plan->ranks; ++r) _scattered[k][r] = collective.mark(r);
    if (round.gather_bytes_per_rank > 0 && _base_pointers.size() > 1)
      collective.all_gather(_base_pointers, round.gather_offset, round.gather_bytes_per_rank);
    mark("round " + std::to_string(k) + " exchanges queued");
  }

  // Until every direct copy landed, round by round: reports progress and stops (once what is
  // queued has drained) where keep_going says so.
  void wait_direct() {
    const std::uint64_t total = _plan->read_bytes;
    for (std::size_t k = 0; k < _split.size(); ++k) {
      for (std::size_t r = 0; r < devices().size(); ++r)
        for (void* copied : _copied[k][r]) {
          detail::device_context(devices()[r].index).make_current();
          FERRY_CU(cuEventSynchronize, static_cast<shim::cu::Event>(copied));
        }
      if (_split[k].direct_bytes == 0) continue;
      const std::uint64_t now = _done->fetch_add(_split[k].direct_bytes) + _split[k].direct_bytes;
      if (_options.load.progress) _options.load.progress(now, total);
      if (_options.load.keep_going && !_options.load.keep_going()) {
        _direct->drain();
        _collective->wait();
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

  // A phase of the load reached now (FanoutStats::timeline).
  void mark(std::string name) {
    _result._stats.timeline.emplace_back(std::move(name), since(_started));
  }

  std::shared_ptr<const Checkpoint> _checkpoint;
  const FanoutOptions& _options;
  Clock::time_point _started;
  double _round0_submitted = 0;
  const detail::MapSources& _map;
  unsigned _n = 0;  // ranks
  // Declared first so that they are freed last, after tickets and collectives have drained.
  FanoutLoad _result;
  std::vector<std::shared_ptr<void>> _scratch_memory;  // two banks per rank, for scatters
  std::vector<std::shared_ptr<detail::PrimaryContext>> _contexts;
  std::unique_ptr<detail::Collective> _collective;
  detail::EngineSettings _settings;
  std::string _readers_note;  // how the engine counted the readers, for settings_source
  std::shared_ptr<const FanoutPlan> _plan;
  std::vector<std::uintptr_t> _bases;          // per rank: its destination
  std::vector<void*> _base_pointers;           // the same, as pointers
  std::vector<std::uintptr_t> _scratch;        // per rank: its scratch banks, or 0
  std::vector<detail::MappedSource> _sources;  // per file: its registered mapping, or why none
  std::vector<std::uint64_t> _direct_file_bytes;
  std::vector<detail::RoundReads> _split;       // per round: direct copies and staged reads
  std::optional<detail::DirectCopies> _direct;  // declared after the memory: drained first
  bool _per_device = false;
  bool _at_tail = false;
  TransferOptions _transfer;  // of every submission
  std::shared_ptr<std::atomic<std::uint64_t>> _done =
      std::make_shared<std::atomic<std::uint64_t>>(0);  // bytes landed, for progress
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

}  // namespace ferry
