// kv::WindowRegistrar (kv/window_registrar.hpp): windows registered on the store's own thread,
// one request per window at a time, never while a put holds it, after the store's transfers
// (Busy) or once they have kept it waiting long enough, and refusals kept for the next get's
// reason. The registrations here only record what ran.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kv/window_registrar.hpp"

namespace ferry::test {
namespace {

using detail::kv::WindowRegistrar;
using Window = WindowRegistrar::Window;

struct Recorder {
  std::mutex mutex;
  std::vector<Window> registered;
  std::atomic<bool> busy_seen{false};  // a registration ran while a Busy was alive
  std::atomic<bool> busy{false};
  std::string refuse;  // what the next registration answers ("" registers)

  WindowRegistrar::RegisterOne callback() {
    return [this](const Window& w) {
      if (busy) busy_seen = true;
      std::lock_guard lock(mutex);
      registered.push_back(w);
      return refuse;
    };
  }
  std::size_t count() {
    std::lock_guard lock(mutex);
    return registered.size();
  }
};

void wait_until_idle(const WindowRegistrar& r) {
  for (int i = 0; i < 30000 && r.pending() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(r.pending(), 0u) << "a registration never ran";
}

TEST(WindowRegistrar, RegistersEachRequestedWindowOnceAndKeepsRefusals) {
  Recorder rec;
  WindowRegistrar r(rec.callback());
  {
    const WindowRegistrar::Busy busy(r);  // none starts before all three are asked for
    r.request({0, 1});
    r.request({0, 1});  // queued already: once
    r.request({1, 0});
  }
  wait_until_idle(r);
  EXPECT_EQ(rec.count(), 2u);
  EXPECT_EQ(r.refusal({0, 1}), "");
  rec.refuse = "not fully in the page cache";
  r.request({0, 2});
  wait_until_idle(r);
  EXPECT_EQ(r.refusal({0, 2}), "not fully in the page cache");
  rec.refuse.clear();
  r.request({0, 2});  // asked again: registered, the refusal forgotten
  wait_until_idle(r);
  EXPECT_EQ(r.refusal({0, 2}), "");
  EXPECT_EQ(rec.count(), 4u);
}

TEST(WindowRegistrar, AHeldWindowIsNotRegistered) {
  Recorder rec;
  WindowRegistrar r(rec.callback());
  const std::vector<Window> held = {{0, 3}};
  r.hold(held);
  r.request({0, 3});  // refused while held: the next get that finds it asks again
  r.request({0, 4});
  wait_until_idle(r);
  r.unhold(held);
  ASSERT_EQ(rec.count(), 1u);
  EXPECT_EQ(rec.registered[0], (Window{0, 4}));
  r.request({0, 3});
  wait_until_idle(r);
  EXPECT_EQ(rec.count(), 2u);
}

// While the store's transfers run, registrations wait for them to end.
TEST(WindowRegistrar, RegistrationsWaitForTheStoresTransfers) {
  Recorder rec;
  WindowRegistrar r(rec.callback());
  {
    std::optional<WindowRegistrar::Busy> busy;
    busy.emplace(r);
    rec.busy = true;
    r.request({0, 0});
    // Well within the longest wait: nothing may have run yet (a late thread only delays it).
    std::this_thread::sleep_for(WindowRegistrar::Waits{}.longest / 10);
    EXPECT_EQ(rec.count(), 0u);
    rec.busy = false;
    busy.reset();
  }
  wait_until_idle(r);
  EXPECT_EQ(rec.count(), 1u);
  EXPECT_FALSE(rec.busy_seen);
}

// A transfer that just ended: registrations wait for the store to stay quiet for a while (the
// engine's own work after a load runs then), not for the first instant it is idle.
TEST(WindowRegistrar, RegistrationsWaitForAQuietStoreNotAnIdleInstant) {
  Recorder rec;
  WindowRegistrar r(rec.callback(), {std::chrono::seconds(60), std::chrono::seconds(120)});
  {
    const WindowRegistrar::Busy busy(r);
    r.request({0, 0});
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(rec.count(), 0u);
  EXPECT_EQ(r.pending(), 1u);
}  // stops with it still queued

// A store quiet since before the request: its registration does not wait.
TEST(WindowRegistrar, AQuietStoreRegistersAtOnce) {
  Recorder rec;
  WindowRegistrar r(rec.callback(), {std::chrono::seconds(60), std::chrono::seconds(120)});
  r.request({1, 2});
  wait_until_idle(r);
  EXPECT_EQ(rec.count(), 1u);
}

// A store that is never idle still has its windows registered, after the longest wait each.
TEST(WindowRegistrar, ATransferThatNeverEndsDelaysRegistrationsOnly) {
  Recorder rec;
  WindowRegistrar r(rec.callback());
  const WindowRegistrar::Busy busy(r);
  rec.busy = true;
  r.request({2, 7});
  wait_until_idle(r);
  EXPECT_EQ(rec.count(), 1u);
  EXPECT_TRUE(rec.busy_seen);
}

TEST(WindowRegistrar, StopsWithRequestsStillQueued) {
  std::atomic<int> ran{0};
  std::optional<WindowRegistrar> r;
  r.emplace([&](const Window&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ++ran;
    return std::string();
  });
  for (std::uint64_t i = 0; i < 1000; ++i) r->request({0, i});
  r.reset();  // waits for the one running, drops the rest
  EXPECT_LT(ran, 1000);
}

}  // namespace
}  // namespace ferry::test
