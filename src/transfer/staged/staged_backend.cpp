// The staged path's backend: plans a submission (groups, chunk, workers and slots inside the
// staging bound, a page-cache-DMA run's larger groups on fewer workers) and posts its jobs
// (staged_job.cpp) on the process's worker pool; the last job to end finishes the run.
#include <algorithm>
#include <memory>
#include <mutex>
#include <string>

#include "io/source_file.hpp"
#include "transfer/backend.hpp"
#include "services/copier.hpp"
#include "transfer/staged/staged_plan.hpp"
#include "transfer/staged/staged_run.hpp"
#include "transfer/staged/staged_units.hpp"
#include "transfer/ticket_state.hpp"
#include "services/worker_pool.hpp"

namespace ferry::detail {
namespace {

// Page-cache DMA runs (every extent from a registered mapping): groups of up to this many bytes,
// their copies coalesced where file and memory are both contiguous, on at most this many
// workers (each its own stream): a worker only queues copies there.
constexpr std::uint64_t kMappedChunk = 64ull << 20;
constexpr unsigned kMappedThreads = 4;

class StagedBackend final : public TransferBackend {
 public:
  std::string_view name() const override { return "staged"; }

  Verdict probe(const FileSet&, const Device&, const TransferOptions&) const override {
    return {true, "staged", "reads and writes through pinned host staging"};
  }

  void start(const std::shared_ptr<TicketState>& ticket) const override {
    auto run = std::make_shared<StagedRun>();
    run->ticket = ticket;
    TicketState& t = *ticket;
    StagedSettings wanted = wanted_settings(t.options);
    run->page_cache = lease_page_cache(t);
    if (run->page_cache) run->stats.pipeline.page_cache_leased = since(run->started);
    // Every extent copies from a page-cache mapping: no reads, no staging. Large groups of
    // coalesced copies on a few streams (one 1.2 GB copy from a registered mapping runs at pinned
    // H2D, 4 MiB ones well below it).
    const bool mapped_only = all_from_page_cache(t, run->page_cache.get());
    if (mapped_only) {
      wanted.chunk = std::max(wanted.chunk, kMappedChunk);
      wanted.threads = std::min(wanted.threads, kMappedThreads);
    }
    if (t.options.interleave && !mapped_only) wanted.chunk = spread_chunk(t, wanted);
    // A wave of the workers' first reads at each end of the submission in quarter chunks (an
    // interleaved one's pieces no smaller than its spread allows).
    std::uint64_t edge_chunk = std::max<std::uint64_t>(
        wanted.chunk / 4 / kDirectAlignment * kDirectAlignment, kMinEdgeChunk);
    if (t.options.interleave) edge_chunk = std::max(edge_chunk, smallest_spread_piece(t));
    const auto plan = [&](bool rounds) {
      run->plan = plan_staged(t.extents, wanted.chunk, std::uint64_t{wanted.threads} * wanted.chunk,
                              edge_chunk, rounds);
    };
    // An interleaved read for an observer: extent by extent, in units (staged_units.hpp), where
    // they keep every worker busy; else in rounds.
    const bool in_units = t.options.interleave && t.options.observer &&
                          t.direction == Direction::FileToMemory && !mapped_only;
    plan(t.options.interleave && !in_units);
    if (in_units) {
      run->units =
          observed_units(run->plan, configure(t.options, t.direction, wanted, run->plan).threads);
      if (run->units.empty()) plan(true);
    }
    for (std::size_t e = 0; e < t.extents.size(); ++e)
      t.records[e].pieces_left = run->plan.pieces_per_extent[e];
    if (mapped_only) {
      run->staging_needed = false;
      const std::uint64_t groups = std::max<std::size_t>(run->plan.groups.size(), 1);
      run->settings = {static_cast<unsigned>(std::min<std::uint64_t>(wanted.threads, groups)), 1,
                       std::min(wanted.chunk, std::max<std::uint64_t>(run->plan.largest_group, 1))};
    } else {
      run->settings = configure(t.options, t.direction, wanted, run->plan);
      if (!run->units.empty())  // no worker without a unit
        run->settings.threads = static_cast<unsigned>(
            std::min<std::size_t>(run->settings.threads, run->units.size() - 1));
    }
    const bool writing = t.direction == Direction::MemoryToFile;
    run->files.resize(t.files->size());
    for (const auto& x : t.extents) {
      auto& file = run->files[x.file];
      if (!file) file = std::make_unique<SourceFile>(t.files, x.file, t.options.io, writing);
      for (const auto& s : x.spans)
        if (s.device.is_cuda() &&
            std::find(run->gpus.begin(), run->gpus.end(), s.device) == run->gpus.end())
          run->gpus.push_back(s.device);
    }
    // Threads the system refuses are not fatal: fewer workers run, or the caller's thread.
    WorkerPool& pool = transfer_workers();
    const unsigned available = pool.reserve(run->settings.threads);
    unsigned jobs = run->settings.threads;
    if (available < jobs) {
      jobs = std::max(1u, available);
      t.stats.note += std::string(t.stats.note.empty() ? "" : "; ") + "ran " +
                      std::to_string(jobs) + " of " + std::to_string(run->settings.threads) +
                      " worker threads: " + pool.last_failure();
    }
    if (t.options.copy_streams > 0)
      run->shared_streams = std::make_unique<CopyStreams>(std::min(t.options.copy_streams, jobs));
    run->stats.threads = jobs;
    run->stats.slots_per_thread = run->settings.slots;
    run->stats.chunk_bytes = run->settings.chunk;
    run->jobs_left = jobs;
    {
      std::lock_guard lock(t.mutex);
      t.jobs_running = jobs;
      t.jobs_queuing = jobs;
    }
    pool.post(
        [run] {
          run_staged_job(run);
          bool last = false;
          {
            std::lock_guard lock(run->mutex);
            last = --run->jobs_left == 0;
          }
          if (last) finish_run(*run);
          run->ticket->job_finished();
        },
        jobs);
  }
};

}  // namespace

const TransferBackend& staged_backend() {
  static const StagedBackend backend;
  return backend;
}

}  // namespace ferry::detail
