// A staged job's reads (file -> memory): groups one at a time (or an observed read's units),
// each copied straight from a registered page-cache mapping, read straight into host memory, or
// read into the next slot and copied out while the next group is read.
#include <algorithm>

#include "ferry/error.hpp"
#include "io/source_file.hpp"
#include "transfer/staged/staged_job.hpp"
#include "transfer/staged/staged_plan.hpp"
#include "transfer/ticket_state.hpp"

namespace ferry::detail {
namespace {

// Observed reads from the page cache go in slices of this size (a multiple of the page size, well
// inside a core's L2), each observed while still in cache (read_in_slices).
constexpr std::uint64_t kObserveSlice = 256ull << 10;

}  // namespace

// Takes groups one at a time, or, where the run has units (an observed read: an extent's groups
// all in one unit), a unit at a time, its groups in order.
void Job::read_loop(JobTimes& times, Stopwatch& clock) {
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

void Job::read_group(const Group& g, std::uint64_t k, JobTimes& times, Stopwatch& clock) {
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
    if (_t.options.observer && !f.direct() && g.size > kObserveSlice)
      read_in_slices(g, s, f, next_piece, times, clock);
    else
      read_whole(g, s, f, next_piece, times, clock);
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

// The group in one read into slot `s`, then its pieces' copies; `next_piece` follows them.
void Job::read_whole(const Group& g, unsigned s, SourceFile& f, std::uint32_t& next_piece,
                     JobTimes& times, Stopwatch& clock) {
  const std::byte* data = f.read(*_open, g.file_offset, g.size, slot(s));
  times.read += clock.lap();
  _timeline.read_done(since(_run->started));
  // Piece by piece, so that a cancel (say, from the progress callback) stops at the next extent
  // even inside a group.
  for (; next_piece < g.first + g.count && !cancelled(); ++next_piece) {
    const Piece& p = _run->plan.pieces[next_piece];
    const std::byte* bytes = data + (file_offset(p) - g.file_offset);
    put(p, bytes);
    _t.observe(p.extent, p.extent_offset, bytes, p.size);  // while the copies run
    piece_landed(p);
  }
}

// A group of a file with a page-cache lease (staged_page_cache.hpp) is copied straight from the
// mapping: no read, no slot. Returns whether it was (each piece landed or failed). Copies that
// are contiguous in the file and in memory on one device become one copy: a checkpoint loaded
// into one allocation in file order is a few copies per group, not one per tensor or read.
bool Job::copy_from_page_cache(const Group& g) {
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
    piece_landed(p);
    copied += p.size;
  }
  fence_slot(0);  // closes a profiled run of copies; no slot waits on it
  _run->page_cache[g.file].bytes.fetch_add(copied, std::memory_order_relaxed);
  return true;
}

// A group read from the page cache for an observer, in slices of kObserveSlice bytes (cut at file
// offsets that are multiples of it), each observed right after it lands, while it is still in the
// CPU's cache (after the whole group, the observer would read it from memory again). The group's
// copies are queued once it is all in the slot, one per run of bytes contiguous in memory
// (add_copy_runs), not one per slice: each copy is a driver call, and the DMA engine moves small
// copies well below its rate. The bytes sit in the slot where one read of the group would put
// them. A copy the driver refuses fails the extents of the pieces it carried; a read that fails
// leaves `next_piece` at the group's first piece, for read_singly() (whose observer calls then
// skip the bytes seen already: see TicketState::observe).
void Job::read_in_slices(const Group& g, unsigned s, SourceFile& f, std::uint32_t& next_piece,
                         JobTimes& times, Stopwatch& clock) {
  const std::byte* group = read_observed(g, s, f, times, clock);
  if (cancelled()) return;
  std::vector<CopyRun>& runs = _copy_runs;
  runs.clear();
  for (std::uint32_t i = g.first; i < g.first + g.count; ++i) {
    const Piece& p = _run->plan.pieces[i];
    add_copy_runs(_t.extents[p.extent], p, i, group + (file_offset(p) - g.file_offset), runs);
  }
  const std::vector<bool>& failed = put_runs(g, runs, g.count);
  for (; next_piece < g.first + g.count; ++next_piece)
    if (!failed[next_piece - g.first]) piece_landed(_run->plan.pieces[next_piece]);
}

// read_in_slices' reads, each slice observed as it lands; returns the group's first byte in the
// slot (null where cancelled before the first slice).
const std::byte* Job::read_observed(const Group& g, unsigned s, SourceFile& f, JobTimes& times,
                                    Stopwatch& clock) {
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
  return group;
}

// A group of one piece that lands in one span of host memory is read straight into it (no
// staging, no copy) where the file's path allows; returns whether it was (landed or failed).
bool Job::read_into_host(const Group& g) {
  if (g.count != 1) return false;
  const Piece& p = _run->plan.pieces[g.first];
  std::byte* memory = nullptr;
  unsigned spans = 0;
  for_spans(_t.extents[p.extent], p,
            [&](const MemorySpan& s, std::uint64_t in_span, std::uint64_t, std::uint64_t) {
              ++spans;
              if (!s.device.is_cuda() && s.data) memory = static_cast<std::byte*>(s.data) + in_span;
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
  piece_landed(p);
  return true;
}

// A group whose read failed, again piece by piece from piece `from`: each piece fails or lands
// alone.
void Job::read_singly(const Group& g, std::uint32_t from, unsigned s) {
  for (std::uint32_t i = from; i < g.first + g.count && !cancelled(); ++i) {
    const Piece& p = _run->plan.pieces[i];
    try {
      wait_slot(s);
      SourceFile& f = file(g);
      const std::byte* bytes = f.read(*_open, file_offset(p), p.size, slot(s));
      put(p, bytes);
      _t.observe(p.extent, p.extent_offset, bytes, p.size);
      fence_slot(s);
      piece_landed(p);
    } catch (...) {
      _t.fail(p.extent, std::current_exception());
    }
  }
}

}  // namespace ferry::detail
