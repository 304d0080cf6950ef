// The worker threads of a KV store's asynchronous forms: jobs run in the order posted, on a few
// threads started at the first post. The destructor runs every job already posted, then joins;
// run on one of its own threads (the store's last owner let go in a completion callback), it
// leaves that thread to end by itself. A wait on a worker thread runs queued jobs meanwhile
// (run_one_here), so a callback waiting for a later batch of its store never waits for itself.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace ferry::detail::kv {

class AsyncRunner {
 public:
  explicit AsyncRunner(unsigned threads);
  AsyncRunner(const AsyncRunner&) = delete;
  AsyncRunner& operator=(const AsyncRunner&) = delete;
  ~AsyncRunner();

  void post(std::function<void()> job);
  // Whether the calling thread is one of this runner's.
  bool on_this_thread() const;
  // On a worker thread (of any runner): runs one job queued there and returns true; else false.
  static bool run_one_here();

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable changed;
    std::deque<std::function<void()>> jobs;
    bool stopping = false;
  };
  static void run(std::shared_ptr<State> state);  // each thread holds the state it serves

  unsigned _wanted;
  std::shared_ptr<State> _state;
  std::vector<std::thread> _threads;  // under _state->mutex
};

}  // namespace ferry::detail::kv
