// What a submission shares between its caller (Ticket) and its workers: the batch, per-extent
// progress, and completion. Workers hold it by shared_ptr, so it outlives a dropped Ticket.
#pragma once

#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda/cuda_resources.hpp"
#include "ferry/transfer.hpp"
#include "transfer/backend.hpp"
#include "services/copier.hpp"

namespace ferry::detail {

struct TicketState {
  struct ExtentRecord {
    std::atomic<std::uint64_t> bytes{0};
    std::atomic<std::uint32_t> pieces_left{0};
    std::exception_ptr error;  // under TicketState::mutex
    // The extent's bytes options.observer has seen, or kObservingAbandoned.
    std::atomic<std::uint64_t> observed{0};
    // Which worker's copier of which GPU queued the extent's copies (Job::copier_key), or
    // kNoCopier, or kSeveralCopiers (options.extent_copied is then not called).
    std::atomic<std::int64_t> copier{kNoCopier};
  };
  static constexpr std::int64_t kNoCopier = -1, kSeveralCopiers = -2;

  TicketState(std::shared_ptr<const FileSet> files, Direction direction,
              std::vector<Extent> extents, TransferOptions options);

  std::shared_ptr<const FileSet> files;
  Direction direction;
  std::vector<Extent> extents;
  TransferOptions options;
  std::uintptr_t registered_base = 0;  // cuFile: a registered buffer holding the destinations
  // options.destination's cuFile registration: wait() drops it in the waiting thread once the
  // work is done, before the caller can free the memory.
  mutable std::unique_ptr<RegisteredBuffer> registration;
  std::uint64_t registered_bytes = 0;

  std::vector<ExtentRecord> records;
  std::atomic<bool> cancel{false};
  // options.progress, moved out: wait() drops it in the waiting thread once the work is done,
  // so a callback owning foreign objects (a Python callable) is never destroyed on a worker.
  mutable std::function<void(std::uint64_t, std::uint64_t)> progress;
  bool reports_progress = false;  // progress was given: landed() takes the lock only then
  std::atomic<std::uint64_t> progress_done{0};
  std::uint64_t progress_total = 0;

  mutable std::mutex mutex;
  mutable std::condition_variable changed;
  unsigned jobs_running = 0;  // not finished
  unsigned jobs_queuing = 0;  // have not queued their last copy yet
  std::exception_ptr first_error;
  bool job_lost = false;  // a job stopped early: observers stop waiting for its bytes
  // Nanoseconds workers spent in options.observer, and waiting for an extent's earlier bytes.
  std::atomic<std::uint64_t> observing_ns{0}, observe_waiting_ns{0};
  // Workers waiting in observe(): only then does a worker that moved an extent's observation on
  // take the mutex to wake them (not once per observed slice).
  std::atomic<unsigned> observe_waiters{0};
  // An extent whose bytes were seen only in part (a group redone after a failed read, whose
  // pieces the observer saw in part): nothing more of it is observed, nobody waits for it.
  static constexpr std::uint64_t kObservingAbandoned = ~std::uint64_t{0};
  std::vector<PooledEvent> queued;  // recorded behind each job's last copies (GPU jobs)
  TransferStats stats;

  // A piece of extent `e` failed.
  void fail(std::size_t e, std::exception_ptr error);
  // A piece of extent `e` moved `bytes`; returns whether it was the extent's last.
  bool landed(std::size_t e, std::uint64_t bytes);
  // Copies of extent `e` were queued on copier `key` (see ExtentRecord::copier).
  void copied_by(std::size_t e, std::int64_t key);
  // Hands `size` bytes of extent `e` from `offset`, now at `data` in host memory, to
  // options.observer, in extent order: waits until the bytes before `offset` were seen, and
  // skips where the extent failed or the transfer was cancelled first, or where these bytes were
  // seen already (a group redone); bytes seen in part abandon the extent's observation.
  void observe(std::size_t e, std::uint64_t offset, const std::byte* data, std::uint64_t size);
  void wake_observers();                           // after an extent's observation moved on
  void job_queued(std::vector<PooledEvent> ends);  // once per job
  void job_finished();
  void wait() const;
};

}  // namespace ferry::detail
