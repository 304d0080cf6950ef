// A staged job's life (lease its slots, make its copiers, run its loop, drain, report to the
// run) and what every group needs: the copiers, the open file, the slots, the copies of a piece.
#include "transfer/staged/staged_job.hpp"

#include <algorithm>
#include <mutex>
#include <optional>

#include "cuda/cuda_resources.hpp"
#include "ferry/error.hpp"
#include "io/source_file.hpp"
#include "services/copier.hpp"
#include "transfer/staged/staged_plan.hpp"
#include "transfer/ticket_state.hpp"

namespace ferry::detail {
namespace {

// The earliest of two times where 0 means "not reached".
double earliest(double a, double b) { return a == 0 ? b : b == 0 ? a : std::min(a, b); }

}  // namespace

void Job::operator()() {
  // Pinning staging and syncing the copies must not invalidate a caller's graph capture.
  std::optional<RelaxedCaptureMode> relaxed;
  if (!_run->gpus.empty()) relaxed.emplace();
  Stopwatch clock;
  _timeline.started = since(_run->started);
  JobTimes times;
  Staging staging;
  {
    PinnedPool::Lease lease;
    try {
      if (_run->staging_needed)  // else every group copies from a page-cache mapping
        lease_staging(lease, clock, staging);
      for (const Device& d : _run->gpus) copier(d);
      times.setup += clock.lap();
      _timeline.streams_ready = since(_run->started);
      if (_t.direction == Direction::FileToMemory)
        read_loop(times, clock);
      else
        write_loop(times, clock);
    } catch (...) {
      lost();
    }
    drain(times, clock);
  }
  report(times, staging);
}

void Job::lease_staging(PinnedPool::Lease& lease, Stopwatch& clock, Staging& staging) {
  const Device* pin = _run->gpus.empty() ? nullptr : &_run->gpus.front();
  lease = staging_pool().lease(slot_bytes(_run->settings.chunk, _t.direction),
                               _run->settings.slots, 1,
                               pin ? &device_context(pin->index) : nullptr);
  // The first slot now (a job that cannot pin even that is lost, as one without staging); the
  // others as they are first used, while this job's copies run.
  lease.ready(0);
  staging.seconds = clock.lap();
  _timeline.staging_ready = since(_run->started);
  staging.bytes = std::uint64_t{lease.slots()} * lease.slot_bytes();
  staging.pinned = lease.pinned();
  _slots = lease.slots();
  _lease = &lease;
}

// The job could not start (no staging, no stream): its groups fall to the other jobs, or, where
// none is left, are failed by finish().
void Job::lost() {
  {
    std::lock_guard lock(_t.mutex);
    if (!_t.first_error) _t.first_error = std::current_exception();
    _t.job_lost = true;  // a group it held may never be observed
  }
  _t.changed.notify_all();
}

// Hands the ticket the events behind the job's copies, waits for them, takes the profiled copy
// times and lets go of the copiers and the open file (before the lease goes).
void Job::drain(JobTimes& times, Stopwatch& clock) {
  std::vector<PooledEvent> ends;
  try {
    for (auto& [d, c] : _copiers)
      if (auto e = c->mark_end()) ends.push_back(std::move(e));
  } catch (...) {
    // A stream that cannot take an event has failed its copies already.
  }
  _t.job_queued(std::move(ends));
  for (auto& [device, copier] : _copiers) copier->drain();
  times.wait += clock.lap();
  if (!_copiers.empty()) _timeline.copies_done = since(_run->started);
  // A job holding copiers made its first one after the reference was recorded (call_once).
  if (!_copiers.empty() && _run->reference) {
    for (auto& [device, copier] : _copiers)
      for (const auto& interval : copier->timed_copies(*_run->reference))
        _copy_times.push_back(interval);
  }
  _copiers.clear();
  _open.reset();
}

// The job's statistics and timeline, added to the run's.
void Job::report(const JobTimes& times, const Staging& staging) {
  std::lock_guard lock(_run->mutex);
  TransferStats& s = _run->stats;
  PipelineTimes& p = s.pipeline;
  p.first_job = earliest(p.first_job, _timeline.started);
  p.last_job = std::max(p.last_job, _timeline.started);
  p.staging_ready = std::max(p.staging_ready, _timeline.staging_ready);
  p.streams_ready = std::max(p.streams_ready, _timeline.streams_ready);
  p.first_read = earliest(p.first_read, _timeline.first_read);
  p.first_copy = earliest(p.first_copy, _timeline.first_copy);
  p.last_read = std::max(p.last_read, _timeline.last_read);
  p.last_copy = std::max(p.last_copy, _timeline.last_copy);
  p.copies_done = std::max(p.copies_done, _timeline.copies_done);
  _run->copy_times.insert(_run->copy_times.end(), _copy_times.begin(), _copy_times.end());
  s.staging_bytes += staging.bytes;
  s.staging_pinned = s.staging_pinned || staging.pinned;
  s.staging_seconds = std::max(s.staging_seconds, staging.seconds);
  s.setup_thread_seconds += times.setup;
  s.read_thread_seconds += times.read;
  s.wait_thread_seconds += times.wait;
  s.queue_thread_seconds += times.queue;
  s.copies += _copies;
}

Copier& Job::copier(const Device& device) {
  for (auto& [d, c] : _copiers)
    if (d == device) return *c;
  const bool timed = _t.options.profile_copies && device.is_cuda() && device == _run->gpus.front();
  auto c = make_copier(device, _slots, timed, _run->shared_streams.get(), _worker);
  c->after(_t.options.after_event);
  // The reference is recorded before any job's first copy: every job makes its copiers before
  // reading, and waits here until the first has recorded it.
  if (timed)
    std::call_once(_run->reference_once, [&] {
      auto reference = std::make_unique<Event>(true);
      c->record(*reference);
      _run->reference = std::move(reference);
    });
  _copiers.emplace_back(device, std::move(c));
  return *_copiers.back().second;
}

// The file of group `g`, opened (or kept from the last group).
SourceFile& Job::file(const Group& g) {
  SourceFile& f = *_run->files[g.file];
  if (_open_index != g.file) {
    _open.reset();  // closable while the next one opens
    _open_index = UINT32_MAX;
    _open = f.open();
    _open_index = g.file;
  }
  return f;
}

// Slot `s`, pinned before its first use where it serves a GPU (PinnedPool::Lease::ready).
std::byte* Job::slot(unsigned s) {
  _lease->ready(s);
  return _lease->slot(s);
}

void Job::wait_slot(unsigned s) {
  for (auto& [d, c] : _copiers) c->wait(s);
}

void Job::fence_slot(unsigned s) {
  for (auto& [d, c] : _copiers) c->fence(s);
}

void Job::landed(const Group& g) {
  for (std::uint32_t i = g.first; i < g.first + g.count; ++i) {
    const Piece& p = _run->plan.pieces[i];
    _t.landed(p.extent, p.size);
  }
}

// GPU copiers only (host memory has no stream to order work behind); one key per worker and GPU.
constexpr std::int64_t kKeysPerWorker = 1024;

std::int64_t Job::copier_key(const Device& device) const {
  return device.is_cuda() ? std::int64_t{_worker} * kKeysPerWorker + device.index
                          : TicketState::kSeveralCopiers;
}

void Job::piece_landed(const Piece& p) {
  if (!_t.landed(p.extent, p.size) || !_t.options.extent_copied) return;
  const std::int64_t key = _t.records[p.extent].copier.load();
  if (key < 0 || key / kKeysPerWorker != _worker) return;
  {
    std::lock_guard lock(_t.mutex);  // a piece failed before (a copy refused): not reported
    if (_t.records[p.extent].error) return;
  }
  try {
    const PooledEvent end = copier(Device::cuda(static_cast<int>(key % kKeysPerWorker))).mark_end();
    if (end) _t.options.extent_copied(p.extent, end->get());
  } catch (...) {
    // No event: the caller orders the extent's bytes by wait(), as for one not reported.
  }
}

// The copies between `data` (where piece `p`'s first byte sits in staging) and its memory.
void Job::put(const Piece& p, const std::byte* data) {
  for_spans(_t.extents[p.extent], p,
            [&](const MemorySpan& s, std::uint64_t in_span, std::uint64_t in_piece,
                std::uint64_t n) {
              if (!s.data) return;
              copier(s.device).put(reinterpret_cast<std::uintptr_t>(s.data) + in_span,
                                   data + in_piece, n);
              _t.copied_by(p.extent, copier_key(s.device));
              ++_copies;
            });
}

void Job::get(const Piece& p, std::byte* data) {
  for_spans(_t.extents[p.extent], p,
            [&](const MemorySpan& s, std::uint64_t in_span, std::uint64_t in_piece,
                std::uint64_t n) {
              copier(s.device).get(data + in_piece,
                                   reinterpret_cast<std::uintptr_t>(s.data) + in_span, n);
              ++_copies;
            });
}

// Queues the copies of `runs` (pieces g.first .. g.first + count); a copy the driver refuses
// fails the extents of the pieces it carried, only those, each once. Returns which pieces failed
// (by index from g.first; valid until the next call).
const std::vector<bool>& Job::put_runs(const Group& g, const std::vector<CopyRun>& runs,
                                       std::uint32_t count) {
  std::vector<bool>& failed = _failed_pieces;
  failed.assign(count, false);
  for (const CopyRun& r : runs) {
    try {
      copier(r.device).put(r.memory, r.source, r.size);
      for (std::uint32_t i = r.first_piece; i <= r.last_piece; ++i)
        _t.copied_by(_run->plan.pieces[i].extent, copier_key(r.device));
      ++_copies;
    } catch (...) {
      for (std::uint32_t i = r.first_piece; i <= r.last_piece; ++i) {
        if (!failed[i - g.first]) _t.fail(_run->plan.pieces[i].extent, std::current_exception());
        failed[i - g.first] = true;
      }
    }
  }
  return failed;
}

void run_staged_job(const std::shared_ptr<StagedRun>& run) {
  Job job(run);
  job();
}

}  // namespace ferry::detail
