// What the jobs of one staged submission share (staged_backend.cpp plans it, staged_job.cpp
// runs each job), and the end of the run: the last job turns the jobs' statistics into the
// ticket's (staged_run_finish.cpp).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "cuda/cuda_resources.hpp"
#include "ferry/transfer.hpp"
#include "io/source_file.hpp"
#include "transfer/staged/copier.hpp"
#include "transfer/staged/staged_page_cache.hpp"
#include "transfer/staged/staged_plan.hpp"
#include "transfer/staged/staged_settings.hpp"
#include "transfer/ticket_state.hpp"

namespace ferry::detail {

using Clock = std::chrono::steady_clock;

// Seconds from `start` to now.
inline double since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// What the jobs of one submission share.
struct StagedRun {
  std::shared_ptr<TicketState> ticket;
  StagedSettings settings;
  StagedPlan plan;
  std::vector<std::unique_ptr<SourceFile>> files;  // null for a file no extent names
  std::vector<Device> gpus;                        // the GPUs the spans name
  // Page-cache DMA: per file, the mapping its groups copy from, or why not (null: option off).
  // Held until the last job ends, after its copies drained.
  std::unique_ptr<PageCacheFile[]> page_cache;
  bool staging_needed = true;  // some group is read into staging (not from a mapping)
  // Where a unit of work starts in plan.groups, and the end: an observed read's groups in units
  // that no extent crosses (staged_units.hpp); empty: groups are taken one by one.
  std::vector<std::size_t> units;
  std::atomic<std::size_t> next{0};             // the next group (or unit) to take
  std::atomic<unsigned> workers{0};             // jobs started, each one's index
  std::unique_ptr<CopyStreams> shared_streams;  // options.copy_streams > 0
  Clock::time_point started = Clock::now();
  // Profiling: a timed event recorded before any copy, on the first job's stream of gpus[0].
  std::once_flag reference_once;
  std::unique_ptr<Event> reference;
  std::mutex mutex;  // guards what follows
  unsigned jobs_left = 0;
  TransferStats stats;
  std::vector<std::pair<double, double>> copy_times;  // profiled copies, seconds after reference
};

// The last job of a run: durability (memory -> file), per-file statistics, the copy timeline,
// completion of the ticket's statistics.
void finish_run(StagedRun& run);

// One worker of the run (staged_job.cpp): leases its slots and cycles through its groups.
void run_staged_job(const std::shared_ptr<StagedRun>& run);

}  // namespace ferry::detail
