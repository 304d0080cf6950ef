// A one-shot latch for the tests, on a mutex and a condition variable. It stands in for
// std::latch, which libstdc++ 12 builds on atomic waits: where there is no futex (mingw-w64, so
// the Windows build run under Wine) those lose wake-ups (see src/platform/thread_barrier.hpp),
// and a test waiting on one hung there for good.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <mutex>

namespace ferry::test {

class Latch {
 public:
  explicit Latch(std::size_t count) : _count(count) {}
  Latch(const Latch&) = delete;
  Latch& operator=(const Latch&) = delete;

  void count_down() {
    std::lock_guard lock(_mutex);
    if (_count > 0 && --_count == 0) _zero.notify_all();
  }
  void wait() {
    std::unique_lock lock(_mutex);
    _zero.wait(lock, [&] { return _count == 0; });
  }
  void arrive_and_wait() {
    count_down();
    wait();
  }

 private:
  std::mutex _mutex;
  std::condition_variable _zero;
  std::size_t _count;
};

}  // namespace ferry::test
