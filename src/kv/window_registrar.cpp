#include "kv/window_registrar.hpp"

#include <algorithm>
#include <exception>
#include <system_error>

namespace ferry::detail::kv {

WindowRegistrar::WindowRegistrar(RegisterOne register_one, Waits waits)
    : _register_one(std::move(register_one)), _waits(waits) {}

WindowRegistrar::~WindowRegistrar() {
  {
    std::lock_guard lock(_mutex);
    _stopping = true;
  }
  _changed.notify_all();
  if (_thread.joinable()) _thread.join();
}

void WindowRegistrar::request(const Window& w) {
  {
    std::lock_guard lock(_mutex);
    if (_stopping || _pending.count(w) || _held.count(w)) return;
    if (!_thread.joinable()) {
      try {
        _thread = std::thread([this] { run(); });
      } catch (const std::system_error& e) {  // gets go on along the usual path, saying why
        _refused[w] = std::string("no thread to register it on: ") + e.what();
        return;
      }
    }
    _pending.insert(w);
    _queued.push_back(w);
  }
  _changed.notify_all();
}

std::string WindowRegistrar::refusal(const Window& w) const {
  std::lock_guard lock(_mutex);
  auto it = _refused.find(w);
  return it == _refused.end() ? std::string() : it->second;
}

std::size_t WindowRegistrar::pending() const {
  std::lock_guard lock(_mutex);
  return _pending.size();
}

void WindowRegistrar::hold(std::span<const Window> windows) {
  std::unique_lock lock(_mutex);
  for (const Window& w : windows) ++_held[w];
  _changed.wait(lock, [&] {
    return !_running || std::find(windows.begin(), windows.end(), *_running) == windows.end();
  });
}

void WindowRegistrar::unhold(std::span<const Window> windows) {
  std::lock_guard lock(_mutex);
  for (const Window& w : windows) {
    auto it = _held.find(w);
    if (it != _held.end() && --it->second == 0) _held.erase(it);
  }
}

WindowRegistrar::Busy::Busy(WindowRegistrar& r) : _registrar(r) {
  std::lock_guard lock(r._mutex);
  ++r._busy;
}

WindowRegistrar::Busy::~Busy() {
  {
    std::lock_guard lock(_registrar._mutex);
    if (--_registrar._busy == 0) _registrar._idle_since = Clock::now();
  }
  _registrar._changed.notify_all();
}

void WindowRegistrar::wait_for_quiet(std::unique_lock<std::mutex>& lock) {
  const Clock::time_point give_up = Clock::now() + _waits.longest;
  while (!_stopping) {
    const Clock::time_point now = Clock::now(), quiet_from = _idle_since + _waits.quiet;
    if (now >= give_up || (_busy == 0 && now >= quiet_from)) return;
    _changed.wait_until(lock, _busy == 0 ? std::min(give_up, quiet_from) : give_up);
  }
}

void WindowRegistrar::run() {
  std::unique_lock lock(_mutex);
  for (;;) {
    _changed.wait(lock, [this] { return _stopping || !_queued.empty(); });
    wait_for_quiet(lock);
    if (_stopping) return;
    const Window w = _queued.front();
    _queued.pop_front();
    if (_held.count(w)) {  // a put writes into it: the next get that finds it resident asks again
      _pending.erase(w);
      continue;
    }
    _running = w;
    lock.unlock();
    std::string why;
    try {
      why = _register_one(w);
    } catch (const std::exception& e) {
      why = e.what();
    }
    lock.lock();
    _running.reset();
    _pending.erase(w);
    if (why.empty())
      _refused.erase(w);
    else
      _refused[w] = std::move(why);
    _changed.notify_all();
  }
}

}  // namespace ferry::detail::kv
