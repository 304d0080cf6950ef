// One process per rank (torch.distributed, vLLM): a rank's reads of one round of a group load,
// started at once so that the caller exchanges a round's bytes while the next one reads, with the
// rank's share of the machine's reader threads (machine_readers.hpp).
#include <algorithm>
#include <chrono>
#include <set>
#include <thread>

#include "cuda/cuda_resources.hpp"
#include "fanout/fanout_reads.hpp"
#include "fanout/machine_readers.hpp"
#include "ferry/error.hpp"
#include "ferry/fanout_load.hpp"
#include "load/settings.hpp"
#include "load/ticket_wait.hpp"

namespace ferry {

using Clock = std::chrono::steady_clock;

namespace {

// A rank's round reads with its share of the machine's readers (machine_readers.hpp).
void take_rank_share(const Checkpoint& checkpoint, const std::vector<FanoutRead>& reads, IoMode io,
                     const MachineShare& share, detail::EngineSettings& settings) {
  static const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::set<std::uint32_t> files;
  for (const FanoutRead& read : reads) files.insert(read.file_index);
  const std::vector<std::uint32_t> list(files.begin(), files.end());
  const bool cached =
      io != IoMode::Direct && detail::reads_from_page_cache(checkpoint.file_set(), list);
  const unsigned ranks = std::max(1u, share.ranks_on_machine);
  const detail::ReaderShare readers =
      detail::share_readers(settings.threads, ranks, ranks, share.rounds_at_once, cached, cores);
  settings.threads = readers.per_submission;  // the staged backend fits them to the staging
  settings.source += detail::concat(
      "; ", settings.threads, " readers: this rank's share of ", readers.machine,
      " on this machine (", ranks, " ranks, ", std::max(1u, share.rounds_at_once),
      " rounds each reading at once; reading ", cached ? "the page cache" : "storage", ")");
}

}  // namespace

FanoutRoundRead start_fanout_round(const Checkpoint& checkpoint, const FanoutPlan& plan,
                                   std::size_t round, unsigned rank, const Device& device,
                                   void* memory, void* scratch, const LoadOptions& options,
                                   const MachineShare& share) {
  FERRY_EXPECT(round < plan.rounds.size() && rank < plan.ranks, std::invalid_argument,
               "read_fanout_round: round ", round, " of ", plan.rounds.size(), ", rank ", rank,
               " of ", plan.ranks, " does not exist");
  FERRY_EXPECT(options.backend != Backend::Cufile, std::invalid_argument,
               "multi-device load: only the staged path runs; use backend auto or posix");
  if (device.is_cuda()) prepare_device(device);
  FanoutRoundRead out;
  out._began = Clock::now();
  out._options = options;
  detail::EngineSettings settings = detail::choose_settings(options, detail::tuning_for(options));
  std::vector<FanoutRead> mine;
  for (const FanoutRead& read : plan.rounds[round].reads)
    if (read.reader == rank) mine.push_back(read);
  if (options.reader_threads == 0) take_rank_share(checkpoint, mine, options.io, share, settings);
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
    TransferOptions t = detail::transfer_options(options, settings);
    t.progress = options.progress;
    // One process per rank: the staged backend copies this rank's reads of files it can lease
    // straight from their registered page cache (one-process loads split the reads themselves).
    t.page_cache_pin_bytes = options.page_cache_pin_bytes;
    out._submitted = std::chrono::duration<double>(Clock::now() - out._began).count();
    out._ticket = submit(checkpoint.shared_file_set(), Direction::FileToMemory,
                         detail::resolve(mine, bases, scratches, devices), t);
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
                            const LoadOptions& options, const MachineShare& share) {
  return start_fanout_round(checkpoint, plan, round, rank, device, memory, scratch, options, share)
      .wait();
}

}  // namespace ferry
