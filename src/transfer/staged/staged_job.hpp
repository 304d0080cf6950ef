// One worker of a staged run (StagedRun, staged_run.hpp): it leases its pinned slots and cycles
// through the run's groups (one or more pieces back to back in one file, at most a chunk; see
// staged_plan.hpp):
//   file -> memory (staged_read.cpp): read a group into a slot, queue its copies out on the
//     worker's stream, and read the next group into the next slot while they run; a slot is
//     reused after its fence.
//   memory -> file (staged_write.cpp): queue the copies of up to `slots` groups into slots ahead,
//     then wait for the oldest and write it (O_DIRECT for the aligned body, buffered edges)
//     while the copies of the next ones run.
// A group that fails is redone piece by piece, so each extent reports its own failure. The
// job's life, its copiers and what every group needs are in staged_job.cpp.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "services/pinned_pool.hpp"
#include "transfer/staged/staged_run.hpp"

namespace ferry::detail {

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

// A job's thread seconds by what it did.
struct JobTimes {
  double setup = 0, read = 0, wait = 0, queue = 0;
};

class Job {
 public:
  explicit Job(std::shared_ptr<StagedRun> run)
      : _run(std::move(run)), _t(*_run->ticket), _worker(_run->workers.fetch_add(1)) {}

  void operator()();

 private:
  struct Staging {  // what the job's lease gave
    double seconds = 0;
    std::uint64_t bytes = 0;
    bool pinned = false;
  };
  // staged_job.cpp: the job's life.
  void lease_staging(PinnedPool::Lease& lease, Stopwatch& clock, Staging& staging);
  void lost();  // the job could not start: what it held falls to the others
  void drain(JobTimes& times, Stopwatch& clock);
  void report(const JobTimes& times, const Staging& staging);

  // staged_job.cpp: what every group needs.
  Copier& copier(const Device& device);
  SourceFile& file(const Group& g);
  std::byte* slot(unsigned s);
  bool cancelled() const { return _t.cancel.load(std::memory_order_relaxed); }
  void wait_slot(unsigned s);
  void fence_slot(unsigned s);
  void landed(const Group& g);
  // A piece of a read landed (its copies queued); the extent's last tells
  // options.extent_copied where the extent's copies all went on this worker's copier of one GPU.
  void piece_landed(const Piece& p);
  std::int64_t copier_key(const Device& device) const;
  void put(const Piece& p, const std::byte* data);
  void get(const Piece& p, std::byte* data);
  std::uint64_t file_offset(const Piece& p) const {
    return _t.extents[p.extent].file_offset + p.extent_offset;
  }
  const std::vector<bool>& put_runs(const Group& g, const std::vector<CopyRun>& runs,
                                    std::uint32_t count);

  // staged_read.cpp: file -> memory.
  void read_loop(JobTimes& times, Stopwatch& clock);
  void read_group(const Group& g, std::uint64_t k, JobTimes& times, Stopwatch& clock);
  void read_whole(const Group& g, unsigned s, SourceFile& f, std::uint32_t& next_piece,
                  JobTimes& times, Stopwatch& clock);
  bool copy_from_page_cache(const Group& g);
  void read_in_slices(const Group& g, unsigned s, SourceFile& f, std::uint32_t& next_piece,
                      JobTimes& times, Stopwatch& clock);
  const std::byte* read_observed(const Group& g, unsigned s, SourceFile& f, JobTimes& times,
                                 Stopwatch& clock);
  bool read_into_host(const Group& g);
  void read_singly(const Group& g, std::uint32_t from, unsigned s);

  // staged_write.cpp: memory -> file.
  struct Filled {  // a slot of the write ring: the group copied into it
    std::size_t group = 0;
    bool failed = false;
  };
  using Ring = std::array<Filled, kMaxSlots>;
  void write_loop(JobTimes& times, Stopwatch& clock);
  void fill_ring(Ring& ring, std::uint64_t& filled, std::uint64_t written, JobTimes& times,
                 Stopwatch& clock);
  void write_slot(const Filled& slot, unsigned s, JobTimes& times, Stopwatch& clock);
  void write_singly(const Group& g, unsigned s);

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

}  // namespace ferry::detail
