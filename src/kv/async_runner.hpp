// The worker threads of a KV store's asynchronous forms: jobs run in the order posted, on a few
// threads started at the first post. The destructor runs every job already posted, then joins.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ferry::detail::kv {

class AsyncRunner {
 public:
  explicit AsyncRunner(unsigned threads) : _wanted(threads) {}
  AsyncRunner(const AsyncRunner&) = delete;
  AsyncRunner& operator=(const AsyncRunner&) = delete;
  ~AsyncRunner();

  void post(std::function<void()> job);

 private:
  void run();

  unsigned _wanted;
  std::mutex _mutex;
  std::condition_variable _changed;
  std::deque<std::function<void()>> _jobs;
  bool _stopping = false;
  std::vector<std::thread> _threads;
};

}  // namespace ferry::detail::kv
