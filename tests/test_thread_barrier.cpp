// detail::ThreadBarrier (platform/thread_barrier.hpp), which `ferry kv bench` meets at between
// batches. The first test's loop over std::barrier instead hung under Wine in 3 of 7 runs
// (mingw-w64's libstdc++ 12 loses wake-ups without a futex); ctest's TIMEOUT makes a hang a
// failure.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "platform/thread_barrier.hpp"

namespace ferry {
namespace {

// Many threads through many phases, the completion slow enough (it sleeps, as the bench's
// fdatasync does) that threads often arrive while the previous phase is being completed.
TEST(ThreadBarrier, EveryThreadSeesEachPhaseCompletedOnceBeforeGoingOn) {
  constexpr unsigned kThreads = 16, kPhases = 300;
  std::uint64_t completions = 0;  // written by the completion only, under the barrier's mutex
  detail::ThreadBarrier meet(kThreads, [&]() noexcept {
    ++completions;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  });
  std::atomic<unsigned> wrong{0};
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (unsigned phase = 0; phase < kPhases; ++phase) {
        if ((phase + t) % 3 == 0) std::this_thread::yield();
        meet.arrive_and_wait();
        // No thread can complete the next phase before this one arrives at it.
        if (completions != phase + 1) ++wrong;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(completions, kPhases);
  EXPECT_EQ(wrong.load(), 0u);
}

TEST(ThreadBarrier, OneThreadCompletesEveryPhaseAlone) {
  unsigned completions = 0;
  detail::ThreadBarrier meet(1, [&]() noexcept { ++completions; });
  for (int i = 0; i < 5; ++i) meet.arrive_and_wait();
  EXPECT_EQ(completions, 5u);
}

}  // namespace
}  // namespace ferry
