// The staged path, both directions, through pinned slots leased from the process's pool. Each
// worker takes groups (one or more pieces back to back in one file, at most a chunk; see
// staged_plan.hpp) and cycles through its slots:
//   file -> memory: read a group into a slot, queue its copies out on the worker's stream, and
//     read the next group into the next slot while they run; a slot is reused after its fence.
//   memory -> file: queue the copies of up to `slots` groups into slots ahead, then wait for the
//     oldest and write it (O_DIRECT for the aligned body, buffered edges) while the copies of
//     the next ones run.
// A group that fails is redone piece by piece, so each extent reports its own failure.
#include "transfer/staged/staged_run.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <mutex>
#include <optional>

#include "cuda/cuda_resources.hpp"
#include "ferry/error.hpp"
#include "io/source_file.hpp"
#include "services/copier.hpp"
#include "services/pinned_pool.hpp"
#include "transfer/staged/staged_plan.hpp"
#include "transfer/staged/staged_units.hpp"
#include "transfer/ticket_state.hpp"

namespace ferry::detail {
namespace {

// Observed reads from the page cache go in slices of this size (a multiple of the page size, well
// inside a core's L2), each observed while still in cache (read_in_slices).
constexpr std::uint64_t kObserveSlice = 256ull << 10;
// Seconds since the last lap (or construction).
class Stopwatch {
 public:
  double lap() {
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - _last).count();
    _last = now;
    return seconds;
  }

 private:
  std::chrono::steady_clock::time_point _last = std::chrono::steady_clock::now();
};

// A job's part of the timeline (PipelineTimes), merged into the run's when it ends.
struct Timeline {
  double started = 0, staging_ready = 0, streams_ready = 0;
  double first_read = 0, first_copy = 0, last_read = 0, last_copy = 0, copies_done = 0;
  void read_done(double t) {
    if (first_read == 0) first_read = t;
    last_read = t;
  }
  void copy_queued(double t) {
    if (first_copy == 0) first_copy = t;
    last_copy = t;
  }
};

// The earliest of two times where 0 means "not reached".
double earliest(double a, double b) { return a == 0 ? b : b == 0 ? a : std::min(a, b); }

struct Times {
  double setup = 0, read = 0, wait = 0, queue = 0;
};

class Job {
 public:
  explicit Job(std::shared_ptr<StagedRun> run)
      : _run(std::move(run)), _t(*_run->ticket), _worker(_run->workers.fetch_add(1)) {}

  void operator()() {
    // Pinning staging and syncing the copies must not invalidate a caller's graph capture.
    std::optional<RelaxedCaptureMode> relaxed;
    if (!_run->gpus.empty()) relaxed.emplace();
    Stopwatch clock;
    _timeline.started = since(_run->started);
    Times times;
    double staging = 0;
    std::uint64_t staged_bytes = 0;
    bool pinned = false;
    {
      PinnedPool::Lease lease;
      try {
        if (_run->staging_needed) {  // else every group copies from a page-cache mapping
          const Device* pin = _run->gpus.empty() ? nullptr : &_run->gpus.front();
          lease = staging_pool().lease(slot_bytes(_run->settings.chunk, _t.direction),
                                       _run->settings.slots, 1,
                                       pin ? &device_context(pin->index) : nullptr);
          // The first slot now (a job that cannot pin even that is lost, as one without
          // staging); the others as they are first used, while this job's copies run.
          lease.ready(0);
          staging = clock.lap();
          _timeline.staging_ready = since(_run->started);
          staged_bytes = std::uint64_t{lease.slots()} * lease.slot_bytes();
          pinned = lease.pinned();
          _slots = lease.slots();
          _lease = &lease;
        }
        for (const Device& d : _run->gpus) copier(d);
        times.setup += clock.lap();
        _timeline.streams_ready = since(_run->started);
        if (_t.direction == Direction::FileToMemory)
          read_loop(times, clock);
        else
          write_loop(times, clock);
      } catch (...) {
        // The job could not start (no staging, no stream): its groups fall to the other jobs,
        // or, where none is left, are failed by finish().
        {
          std::lock_guard lock(_t.mutex);
          if (!_t.first_error) _t.first_error = std::current_exception();
          _t.job_lost = true;  // a group it held may never be observed
        }
        _t.changed.notify_all();
      }
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
    s.staging_bytes += staged_bytes;
    s.staging_pinned = s.staging_pinned || pinned;
    s.staging_seconds = std::max(s.staging_seconds, staging);
    s.setup_thread_seconds += times.setup;
    s.read_thread_seconds += times.read;
    s.wait_thread_seconds += times.wait;
    s.queue_thread_seconds += times.queue;
    s.copies += _copies;
  }

 private:
  Copier& copier(const Device& device) {
    for (auto& [d, c] : _copiers)
      if (d == device) return *c;
    const bool timed =
        _t.options.profile_copies && device.is_cuda() && device == _run->gpus.front();
    auto c = make_copier(device, _slots, timed, _run->shared_streams.get(), _worker);
    c->after(_t.options.after_event);
    // The reference is recorded before any job's first copy: every job makes its copiers
    // before reading, and waits here until the first has recorded it.
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
  SourceFile& file(const Group& g) {
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
  std::byte* slot(unsigned s) {
    _lease->ready(s);
    return _lease->slot(s);
  }
  bool cancelled() const { return _t.cancel.load(std::memory_order_relaxed); }
  void wait_slot(unsigned s) {
    for (auto& [d, c] : _copiers) c->wait(s);
  }
  void fence_slot(unsigned s) {
    for (auto& [d, c] : _copiers) c->fence(s);
  }
  void landed(const Group& g) {
    for (std::uint32_t i = g.first; i < g.first + g.count; ++i) {
      const Piece& p = _run->plan.pieces[i];
      _t.landed(p.extent, p.size);
    }
  }

  // The copies between `data` (where piece `p`'s first byte sits in staging) and its memory.
  void put(const Piece& p, const std::byte* data) {
    for_spans(
        _t.extents[p.extent], p,
        [&](const MemorySpan& s, std::uint64_t in_span, std::uint64_t in_piece, std::uint64_t n) {
          if (!s.data) return;
          copier(s.device).put(reinterpret_cast<std::uintptr_t>(s.data) + in_span, data + in_piece,
                               n);
          ++_copies;
        });
  }
  void get(const Piece& p, std::byte* data) {
    for_spans(
        _t.extents[p.extent], p,
        [&](const MemorySpan& s, std::uint64_t in_span, std::uint64_t in_piece, std::uint64_t n) {
          copier(s.device).get(data + in_piece, reinterpret_cast<std::uintptr_t>(s.data) + in_span,
                               n);
          ++_copies;
        });
  }
  std::uint64_t file_offset(const Piece& p) const {
    return _t.extents[p.extent].file_offset + p.extent_offset;
  }

  // Takes groups one at a time, or, where the run has units (an observed read: an extent's
  // groups all in one unit), a unit at a time, its groups in order.
  void read_loop(Times& times, Stopwatch& clock) {
    const auto& groups = _run->plan.groups;
    const auto& units = _run->units;
    std::uint64_t k = 0;  // groups read so far: the next slot is k % _slots
    while (!cancelled()) {
      const std::size_t u = _run->next.fetch_add(1);
      const std::size_t first = units.empty() ? u : u + 1 < units.size() ? units[u] : groups.size();
      const std::size_t last = units.empty() ? u + 1 : u + 1 < units.size() ? units[u + 1] : 0;
      if (first >= groups.size()) break;
      for (std::size_t i = first; i < last && !cancelled(); ++i, ++k)
        read_group(groups[i], k, times, clock);
    }
  }

  void read_group(const Group& g, std::uint64_t k, Times& times, Stopwatch& clock) {
    if (copy_from_page_cache(g)) {
      times.queue += clock.lap();
      _timeline.copy_queued(since(_run->started));
      return;
    }
    if (read_into_host(g)) {
      times.read += clock.lap();
      _timeline.read_done(since(_run->started));
      return;
    }
    const auto s = static_cast<unsigned>(k % _slots);
    wait_slot(s);  // the slot's previous copies have finished
    times.wait += clock.lap();
    std::uint32_t next_piece = g.first;  // the pieces before it have landed
    try {
      SourceFile& f = file(g);
      if (_t.options.observer && !f.direct() && g.size > kObserveSlice) {
        read_in_slices(g, s, f, next_piece, times, clock);
      } else {
        const std::byte* data = f.read(*_open, g.file_offset, g.size, slot(s));
        times.read += clock.lap();
        _timeline.read_done(since(_run->started));
        // Piece by piece, so that a cancel (say, from the progress callback) stops at the next
        // extent even inside a group.
        for (; next_piece < g.first + g.count && !cancelled(); ++next_piece) {
          const Piece& p = _run->plan.pieces[next_piece];
          const std::byte* bytes = data + (file_offset(p) - g.file_offset);
          put(p, bytes);
          _t.observe(p.extent, p.extent_offset, bytes, p.size);  // while the copies run
          _t.landed(p.extent, p.size);
        }
      }
      fence_slot(s);
      _timeline.copy_queued(since(_run->started));
      times.queue += clock.lap();
    } catch (...) {
      if (g.count == 1) {
        _t.fail(_run->plan.pieces[g.first].extent, std::current_exception());
      } else {
        read_singly(g, next_piece, s);
      }
      clock.lap();
    }
  }

  // Queues the copies of `runs` (pieces g.first .. g.first + count); a copy the driver refuses
  // fails the extents of the pieces it carried, only those, each once. Returns which pieces
  // failed (by index from g.first; valid until the next call).
  const std::vector<bool>& put_runs(const Group& g, const std::vector<CopyRun>& runs,
                                    std::uint32_t count) {
    std::vector<bool>& failed = _failed_pieces;
    failed.assign(count, false);
    for (const CopyRun& r : runs) {
      try {
        copier(r.device).put(r.memory, r.source, r.size);
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

  // A group of a file with a page-cache lease (staged_page_cache.hpp) is copied straight from
  // the mapping: no read, no slot. Returns whether it was (each piece landed or failed).
  // Copies that are contiguous in the file and in memory on one device become one copy: a
  // checkpoint loaded into one allocation in file order is a few copies per group, not one per
  // tensor or read.
  bool copy_from_page_cache(const Group& g) {
    const PageCacheFile* mapped = _run->page_cache.get();
    if (!from_page_cache(mapped, g.file, g.file_offset, g.size)) return false;
    const std::byte* base = mapped[g.file].lease.data();
    std::vector<CopyRun>& runs = _copy_runs;
    runs.clear();
    std::uint32_t end = g.first;
    for (; end < g.first + g.count && !cancelled(); ++end)
      add_copy_runs(_t.extents[_run->plan.pieces[end].extent], _run->plan.pieces[end], end,
                    base + file_offset(_run->plan.pieces[end]), runs);
    const std::vector<bool>& failed = put_runs(g, runs, end - g.first);
    std::uint64_t copied = 0;
    for (std::uint32_t i = g.first; i < end; ++i) {
      if (failed[i - g.first]) continue;
      const Piece& p = _run->plan.pieces[i];
      _t.observe(p.extent, p.extent_offset, base + file_offset(p), p.size);
      _t.landed(p.extent, p.size);
      copied += p.size;
    }
    fence_slot(0);  // closes a profiled run of copies; no slot waits on it
    _run->page_cache[g.file].bytes.fetch_add(copied, std::memory_order_relaxed);
    return true;
  }

  // A group read from the page cache for an observer, in slices of kObserveSlice bytes (cut at
  // file offsets that are multiples of it), each observed right after it lands, while it is still
  // in the CPU's cache (after the whole group, the observer would read it from memory again).
  // The group's copies are queued once it is all in the slot, one per run of bytes contiguous in
  // memory (add_copy_runs), not one per slice: each copy is a driver call, and the DMA engine
  // moves small copies well below its rate. The bytes sit in the slot where one read of the group
  // would put them. A copy the driver refuses fails the extents of the pieces it carried; a read
  // that fails leaves `next_piece` at the group's first piece, for read_singly() (whose observer
  // calls then skip the bytes seen already: see TicketState::observe).
  void read_in_slices(const Group& g, unsigned s, SourceFile& f, std::uint32_t& next_piece,
                      Times& times, Stopwatch& clock) {
    const std::uint64_t base = g.file_offset / kDirectAlignment * kDirectAlignment;
    const std::uint64_t end = g.file_offset + g.size;
    const std::byte* group = nullptr;  // the group's first byte in the slot
    std::uint32_t seen = g.first;      // the first piece not wholly observed
    for (std::uint64_t at = g.file_offset; at < end && !cancelled();) {
      const std::uint64_t to = std::min(end, (at / kObserveSlice + 1) * kObserveSlice);
      const std::uint64_t page = at / kDirectAlignment * kDirectAlignment;
      const std::byte* data = f.read(*_open, at, to - at, slot(s) + (page - base));
      if (!group) group = data;
      times.read += clock.lap();
      _timeline.read_done(since(_run->started));
      for (; seen < g.first + g.count; ++seen) {
        const Piece& p = _run->plan.pieces[seen];
        const std::uint64_t from = std::max(file_offset(p), at);
        const std::uint64_t until = std::min(file_offset(p) + p.size, to);
        if (from < until)
          _t.observe(p.extent, p.extent_offset + (from - file_offset(p)), data + (from - at),
                     until - from);
        if (file_offset(p) + p.size > to) break;  // its rest is in the next slice
      }
      times.queue += clock.lap();
      at = to;
    }
    if (cancelled()) return;
    std::vector<CopyRun>& runs = _copy_runs;
    runs.clear();
    for (std::uint32_t i = g.first; i < g.first + g.count; ++i) {
      const Piece& p = _run->plan.pieces[i];
      add_copy_runs(_t.extents[p.extent], p, i, group + (file_offset(p) - g.file_offset), runs);
    }
    const std::vector<bool>& failed = put_runs(g, runs, g.count);
    for (; next_piece < g.first + g.count; ++next_piece)
      if (!failed[next_piece - g.first])
        _t.landed(_run->plan.pieces[next_piece].extent, _run->plan.pieces[next_piece].size);
  }

  // A group of one piece that lands in one span of host memory is read straight into it (no
  // staging, no copy) where the file's path allows; returns whether it was (landed or failed).
  bool read_into_host(const Group& g) {
    if (g.count != 1) return false;
    const Piece& p = _run->plan.pieces[g.first];
    std::byte* memory = nullptr;
    unsigned spans = 0;
    for_spans(_t.extents[p.extent], p,
              [&](const MemorySpan& s, std::uint64_t in_span, std::uint64_t, std::uint64_t) {
                ++spans;
                if (!s.device.is_cuda() && s.data)
                  memory = static_cast<std::byte*>(s.data) + in_span;
              });
    if (spans != 1 || memory == nullptr) return false;
    try {
      copier(Device::cpu());  // made once: it waits for the caller's event, as copies would
      if (!file(g).read_into(*_open, g.file_offset, g.size, memory)) return false;
      _t.observe(p.extent, p.extent_offset, memory, p.size);
    } catch (...) {
      _t.fail(p.extent, std::current_exception());
      return true;
    }
    _t.landed(p.extent, p.size);
    return true;
  }

  // A group whose read failed, again piece by piece from piece `from`: each piece fails or
  // lands alone.
  void read_singly(const Group& g, std::uint32_t from, unsigned s) {
    for (std::uint32_t i = from; i < g.first + g.count && !cancelled(); ++i) {
      const Piece& p = _run->plan.pieces[i];
      try {
        wait_slot(s);
        SourceFile& f = file(g);
        const std::byte* bytes = f.read(*_open, file_offset(p), p.size, slot(s));
        put(p, bytes);
        _t.observe(p.extent, p.extent_offset, bytes, p.size);
        fence_slot(s);
        _t.landed(p.extent, p.size);
      } catch (...) {
        _t.fail(p.extent, std::current_exception());
      }
    }
  }

  // Up to `slots` groups copied into staging ahead of the write that waits for the oldest.
  void write_loop(Times& times, Stopwatch& clock) {
    const auto& groups = _run->plan.groups;
    struct Filled {
      std::size_t group = 0;
      bool failed = false;
    };
    std::array<Filled, kMaxSlots> ring;
    std::uint64_t filled = 0, written = 0;
    for (;;) {
      while (filled - written < _slots && !cancelled()) {
        const std::size_t i = _run->next.fetch_add(1);
        if (i >= groups.size()) break;
        const auto s = static_cast<unsigned>(filled++ % _slots);
        ring[s] = {i, false};
        const Group& g = groups[i];
        try {
          std::byte* data = slot(s) + g.file_offset % kDirectAlignment;
          for (std::uint32_t p = g.first; p < g.first + g.count; ++p)
            get(_run->plan.pieces[p], data + (file_offset(_run->plan.pieces[p]) - g.file_offset));
          fence_slot(s);
          _timeline.copy_queued(since(_run->started));
        } catch (...) {
          ring[s].failed = true;  // redone piece by piece when its turn to be written comes
        }
        times.queue += clock.lap();
      }
      if (filled == written) break;
      const auto s = static_cast<unsigned>(written++ % _slots);
      const Group& g = groups[ring[s].group];
      if (ring[s].failed) {
        write_singly(g, s);  // each piece copied again, reporting its own failure
        clock.lap();
        continue;
      }
      try {
        wait_slot(s);  // its copies have landed in staging
        times.wait += clock.lap();
        for (std::uint32_t i = g.first; i < g.first + g.count; ++i) {
          const Piece& p = _run->plan.pieces[i];
          _t.observe(p.extent, p.extent_offset,
                     slot(s) + g.file_offset % kDirectAlignment + (file_offset(p) - g.file_offset),
                     p.size);
        }
        file(g).write(*_open, g.file_offset, g.size, slot(s));
        times.read += clock.lap();
        _timeline.read_done(since(_run->started));  // for writes: the write finished
      } catch (...) {
        if (g.count == 1) {
          _t.fail(_run->plan.pieces[g.first].extent, std::current_exception());
        } else {
          write_singly(g, s);
        }
        clock.lap();
        continue;
      }
      landed(g);
    }
  }

  // A group whose copy or write failed, again piece by piece.
  void write_singly(const Group& g, unsigned s) {
    for (std::uint32_t i = g.first; i < g.first + g.count; ++i) {
      const Piece& p = _run->plan.pieces[i];
      try {
        const std::uint64_t at = file_offset(p);
        wait_slot(s);
        get(p, slot(s) + at % kDirectAlignment);
        fence_slot(s);
        wait_slot(s);
        _t.observe(p.extent, p.extent_offset, slot(s) + at % kDirectAlignment, p.size);
        file(g).write(*_open, at, p.size, slot(s));
        _t.landed(p.extent, p.size);
      } catch (...) {
        _t.fail(p.extent, std::current_exception());
      }
    }
  }

  std::shared_ptr<StagedRun> _run;
  TicketState& _t;
  unsigned _worker;
  PinnedPool::Lease* _lease = nullptr;
  unsigned _slots = 1;
  std::vector<std::pair<Device, std::unique_ptr<Copier>>> _copiers;
  std::uint32_t _open_index = UINT32_MAX;
  std::shared_ptr<const PlatformFile> _open;
  Timeline _timeline;
  std::vector<std::pair<double, double>> _copy_times;
  // copy_from_page_cache's and read_in_slices', kept to reuse their memory.
  std::vector<CopyRun> _copy_runs;
  std::vector<bool> _failed_pieces;
  std::uint64_t _copies = 0;  // queued
};

}  // namespace

void run_staged_job(const std::shared_ptr<StagedRun>& run) {
  Job job(run);
  job();
}

}  // namespace ferry::detail
