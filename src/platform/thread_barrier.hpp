// A reusable barrier for a fixed set of threads, on a mutex and a condition variable. It stands in
// for std::barrier, which must not be used here: libstdc++ 12 builds it on atomic waits, and where
// there is no futex (mingw-w64, so every Windows build) those waits lose wake-ups. Its waiter
// (bits/atomic_wait.h, __waiter_pool::_M_do_wait) compares the value before it takes the pool's
// mutex and its notifier signals the condition variable without that mutex, so a phase completed
// between the two leaves the waiter asleep for ever (`ferry kv bench` stalled so under Wine, every
// thread in pthread_cond_wait). Here the count and the phase change only under the mutex.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <utility>

namespace ferry::detail {

template <class Completion>
class ThreadBarrier {
 public:
  // `threads` arrive per phase; the last to arrive runs `completion` (which must not throw)
  // before any of them goes on, as std::barrier does.
  ThreadBarrier(std::size_t threads, Completion completion)
      : _threads(threads), _waiting(0), _completion(std::move(completion)) {}
  ThreadBarrier(const ThreadBarrier&) = delete;
  ThreadBarrier& operator=(const ThreadBarrier&) = delete;

  void arrive_and_wait() {
    std::unique_lock lock(_mutex);
    const std::uint64_t phase = _phase;
    if (++_waiting == _threads) {
      _completion();
      _waiting = 0;
      ++_phase;
      lock.unlock();
      _next_phase.notify_all();
      return;
    }
    _next_phase.wait(lock, [&] { return _phase != phase; });
  }

 private:
  std::mutex _mutex;
  std::condition_variable _next_phase;
  const std::size_t _threads;
  std::size_t _waiting;
  std::uint64_t _phase = 0;
  Completion _completion;
};

}  // namespace ferry::detail
