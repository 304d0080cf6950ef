#include "kv/call_gate.hpp"

#include <memory>
#include <stdexcept>
#include <string>

#include "ferry/error.hpp"

namespace ferry::detail::kv {
namespace {

std::mutex hook_mutex;
std::shared_ptr<const std::function<void(std::string_view)>> hook;

}  // namespace

void set_call_hook_for_tests(std::function<void(std::string_view call)> fn) {
  std::lock_guard lock(hook_mutex);
  hook = fn ? std::make_shared<const std::function<void(std::string_view)>>(std::move(fn))
            : nullptr;
}

CallGate::Pass CallGate::enter(std::string_view call, const std::filesystem::path& store) {
  {
    std::lock_guard lock(_mutex);
    FERRY_EXPECT(!_closed, std::invalid_argument, store.string(), ": ", call,
                 " on a closed KV store (close() was called)");
    ++_active;
  }
  Pass pass(this);
  std::shared_ptr<const std::function<void(std::string_view)>> fn;
  {
    std::lock_guard lock(hook_mutex);
    fn = hook;
  }
  if (fn) (*fn)(call);
  return pass;
}

void CallGate::leave() noexcept {
  bool finish = false;
  {
    std::lock_guard lock(_mutex);
    --_active;
    if (_closed && _active == 0 && !_claimed) finish = _claimed = true;
    _changed.notify_all();  // under the lock: a waiter may destroy the gate once it returns
  }
  if (finish) run_finish();
}

void CallGate::run_finish() noexcept {
  try {
    _finish();
  } catch (...) {
    // The finish keeps its own errors (a checkpoint on close is best effort).
  }
  {
    std::lock_guard lock(_mutex);
    _finished = true;
    _changed.notify_all();
  }
}

void CallGate::close(bool wait) {
  std::unique_lock lock(_mutex);
  _closed = true;
  if (wait) _changed.wait(lock, [&] { return _active == 0; });
  if (_active == 0 && !_claimed) {
    _claimed = true;
    lock.unlock();
    run_finish();
    return;
  }
  if (wait) _changed.wait(lock, [&] { return _finished; });
}

}  // namespace ferry::detail::kv
