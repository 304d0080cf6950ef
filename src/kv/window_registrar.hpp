// Registers page-cache windows of the KV store's slabs on a thread of its own, so that no get
// waits for a registration (tens to hundreds of milliseconds a gigabyte, in the driver): a get
// that finds its window resident but not yet registered takes the usual path and asks for it
// here; later gets copy from it (kv/page_cache_gets.hpp).
//
// Coherence with writes: a put into a window holds it (hold()) before releasing its
// registration; a held window is not started, and hold() returns only once a registration of
// it already running has finished, so none can pin the pages the write is about to replace.
//
// Registering contends with the store's own transfers (the driver serialises its registration
// with their copies' submissions: a get of 2 GiB took 0.27 s instead of 0.15 while windows were
// registered beside it) and, likely, with the engine's work right after a load (inside vLLM,
// with 88 ms of registration after the first get, its first token came 50 ms later than the
// staged store's, its load job only 12 ms later), so each registration waits until no transfer
// has been Busy for Waits::quiet, for at most Waits::longest: a store that is never quiet still
// gets its windows registered.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <utility>

namespace ferry::detail::kv {

// How long a registration waits (outside the class: a default argument of its constructor).
struct RegistrarWaits {
  std::chrono::milliseconds quiet{100};    // an engine's step after a load: tens of ms
  std::chrono::milliseconds longest{500};  // the most a registration waits for quiet
};

class WindowRegistrar {
 public:
  using Window = std::pair<int, std::uint64_t>;  // (slab, window index)
  // Registers one window; returns "" where it did, else why not (kept for refusal()).
  using RegisterOne = std::function<std::string(const Window&)>;

  using Waits = RegistrarWaits;

  explicit WindowRegistrar(RegisterOne register_one, Waits waits = {});
  ~WindowRegistrar();  // waits for the registration running, drops those queued
  WindowRegistrar(const WindowRegistrar&) = delete;
  WindowRegistrar& operator=(const WindowRegistrar&) = delete;

  // Queues `w` unless it is queued, running or held. The thread starts at the first request.
  void request(const Window& w);
  // Why the last registration of `w` failed ("" where none did or it succeeded since).
  std::string refusal(const Window& w) const;
  // Windows queued or being registered.
  std::size_t pending() const;

  // While held (counted: holds nest), a window is not started; hold() waits for one running.
  void hold(std::span<const Window> windows);
  void unhold(std::span<const Window> windows);

  // While one is alive, a transfer of the store runs: registrations wait (see above).
  class Busy {
   public:
    explicit Busy(WindowRegistrar& r);
    ~Busy();
    Busy(const Busy&) = delete;
    Busy& operator=(const Busy&) = delete;

   private:
    WindowRegistrar& _registrar;
  };

 private:
  using Clock = std::chrono::steady_clock;
  void run();
  // Until no transfer has been Busy for _waits.quiet (or _waits.longest passed, or stopping).
  void wait_for_quiet(std::unique_lock<std::mutex>& lock);

  RegisterOne _register_one;
  Waits _waits;
  mutable std::mutex _mutex;
  std::condition_variable _changed;
  std::deque<Window> _queued;
  std::set<Window> _pending;  // queued or running
  std::optional<Window> _running;
  std::map<Window, unsigned> _held;
  std::map<Window, std::string> _refused;
  unsigned _busy = 0;
  Clock::time_point _idle_since = Clock::time_point::min();  // when _busy last fell to 0
  bool _stopping = false;
  std::thread _thread;  // last: joined before the rest goes
};

}  // namespace ferry::detail::kv
