// A staged job's writes (memory -> file): up to `slots` groups copied into staging ahead of the
// write that waits for the oldest.
#include "ferry/error.hpp"
#include "io/source_file.hpp"
#include "transfer/staged/staged_job.hpp"
#include "transfer/staged/staged_plan.hpp"
#include "transfer/ticket_state.hpp"

namespace ferry::detail {

void Job::write_loop(JobTimes& times, Stopwatch& clock) {
  Ring ring;
  std::uint64_t filled = 0, written = 0;
  for (;;) {
    fill_ring(ring, filled, written, times, clock);
    if (filled == written) break;
    const auto s = static_cast<unsigned>(written++ % _slots);
    write_slot(ring[s], s, times, clock);
  }
}

// Takes groups and queues their copies into the free slots of the ring.
void Job::fill_ring(Ring& ring, std::uint64_t& filled, std::uint64_t written, JobTimes& times,
                    Stopwatch& clock) {
  const auto& groups = _run->plan.groups;
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
}

// Waits for the copies into slot `s` and writes its group.
void Job::write_slot(const Filled& filled, unsigned s, JobTimes& times, Stopwatch& clock) {
  const Group& g = _run->plan.groups[filled.group];
  if (filled.failed) {
    write_singly(g, s);  // each piece copied again, reporting its own failure
    clock.lap();
    return;
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
    return;
  }
  landed(g);
}

// A group whose copy or write failed, again piece by piece.
void Job::write_singly(const Group& g, unsigned s) {
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

}  // namespace ferry::detail
