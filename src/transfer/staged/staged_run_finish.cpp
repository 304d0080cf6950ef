// The end of a staged run: the jobs' statistics merged into the ticket's.
#include <algorithm>

#include "transfer/staged/staged_run.hpp"

namespace ferry::detail {
namespace {

// The GPU's copy timeline from the profiled intervals: their span and the time at least one
// was queued or running.
void merge_copy_times(std::vector<std::pair<double, double>> times, PipelineTimes& p) {
  if (times.empty()) return;
  std::sort(times.begin(), times.end());
  double busy = 0, start = times.front().first, end = times.front().second, last = end;
  for (const auto& [b, e] : times) {
    if (b > end) {
      busy += end - start;
      start = b;
      end = e;
    } else {
      end = std::max(end, e);
    }
    last = std::max(last, e);
  }
  busy += end - start;
  p.copy_span = last - times.front().first;
  p.copy_busy = busy;
  p.copy_groups = times.size();
}

}  // namespace

void finish_run(StagedRun& run) {
  TicketState& t = *run.ticket;
  TransferStats stats;
  {
    std::lock_guard lock(run.mutex);
    stats = std::move(run.stats);
    merge_copy_times(std::move(run.copy_times), stats.pipeline);
  }
  stats.files.reserve(run.files.size());
  for (std::uint32_t f = 0; f < run.files.size(); ++f) {
    SourceFile* file = run.files[f].get();
    if (file && file->touched() && t.options.durable && t.direction == Direction::MemoryToFile) {
      try {
        file->open()->sync();
      } catch (...) {
        for (std::size_t e = 0; e < t.extents.size(); ++e)
          if (t.extents[e].file == f) t.fail(e, std::current_exception());
      }
    }
    const PageCacheFile* mapped = run.page_cache ? &run.page_cache[f] : nullptr;
    if (mapped && mapped->registered_now)
      stats.page_cache_register_seconds += mapped->register_seconds;
    if (mapped && mapped->bytes.load() > 0) {
      stats.files.push_back(page_cache_file_stats(*mapped, t.files->path(f)));
      stats.bytes_from_registered_page_cache += mapped->bytes.load();
      if (file && file->touched()) {  // ranges past the registered size went through staging
        stats.files.back().bytes_read += file->stats().bytes_read;
        stats.files.back().reason += "; ranges past its registered size read through staging";
      }
    } else if (file && file->touched()) {
      stats.files.push_back(file->stats());
      if (mapped && !mapped->why_not.empty())
        stats.files.back().reason =
            "page-cache DMA not used: " + mapped->why_not + "; " + stats.files.back().reason;
    } else {
      stats.files.push_back(
          {t.files->path(f), IoPath::Buffered, "not touched by this transfer", 0});
    }
    stats.bytes_moved += stats.files.back().bytes_read;
  }
  // Every job drained its copies: the mappings may go (before the ticket completes, so the
  // caller's next transfer finds them idle).
  run.page_cache.reset();
  std::lock_guard lock(t.mutex);
  stats.backend = "staged";
  stats.note = t.stats.note;
  stats.pipeline.done = since(run.started);
  stats.observe_thread_seconds = double(t.observing_ns.load()) / 1e9;
  stats.observe_wait_thread_seconds = double(t.observe_waiting_ns.load()) / 1e9;
  t.stats = std::move(stats);
}

}  // namespace ferry::detail
