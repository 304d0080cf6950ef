// The process's transfer threads, made lazily up to a cap and kept. A thread that cannot be
// made (std::thread throws std::system_error, e.g. under `ulimit -u`) is not fatal: the pool runs
// with the threads it has and says why it has no more; with none at all, jobs run on the
// caller's thread.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ferry::detail {

// Thread counts from options, flags and tuning files are cut to this.
inline constexpr unsigned kMaxWorkerThreads = 64;

class WorkerPool {
 public:
  // How a thread is started; tests inject one that fails.
  using StartThread = std::function<std::thread(std::function<void()>)>;

  explicit WorkerPool(unsigned cap = kMaxWorkerThreads, StartThread start = nullptr);
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  // Runs the queued jobs, then joins the threads.
  ~WorkerPool();

  // Makes threads until `wanted` exist (at most the cap) and returns how many exist: fewer where
  // the system refused one (last_failure() says why).
  unsigned reserve(unsigned wanted);
  // Queues `job` for a pool thread; without any thread, runs it here before returning.
  void post(std::function<void()> job);
  // Queues `count` runs of `job` at once (one lock, the threads woken together): a submission's
  // workers start side by side instead of one wake-up after another.
  void post(const std::function<void()>& job, unsigned count);

  unsigned threads() const;
  std::string last_failure() const;

 private:
  friend WorkerPool& transfer_workers();
  void forget_threads_after_fork() noexcept;
  void run_thread();
  bool grow_locked();  // one more thread; false (and _failure set) where refused

  StartThread _start;
  unsigned _cap;
  mutable std::mutex _mutex;
  std::condition_variable _wake;
  std::deque<std::function<void()>> _jobs;
  std::vector<std::thread> _threads;
  unsigned _idle = 0;
  unsigned _starting = 0;  // made, not yet waiting for work: counted as idle when posting
  bool _stopping = false;
  std::string _failure;
};

// The pool every transfer runs on. Never destroyed (its threads hold CUDA streams, which must
// not be torn down from a static destructor); the process's exit ends the threads.
WorkerPool& transfer_workers();

}  // namespace ferry::detail
