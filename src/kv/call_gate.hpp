// The calls in flight on one KVStore, and its close. Every entry point holds a Pass while it uses
// the store (an asynchronous batch from its post until its callback returned); close() refuses
// new calls at once, and the store's files are released (the finish) once no call is left: by
// close() itself where it may wait, else by the last call to leave (a close from a completion
// callback, which runs inside a batch and so cannot wait for it).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string_view>
#include <utility>

namespace ferry::detail::kv {

class CallGate {
 public:
  class Pass {
   public:
    Pass() = default;
    explicit Pass(CallGate* gate) noexcept : _gate(gate) {}
    Pass(Pass&& other) noexcept : _gate(std::exchange(other._gate, nullptr)) {}
    Pass& operator=(Pass&&) = delete;
    ~Pass() {
      if (_gate) _gate->leave();
    }

   private:
    CallGate* _gate = nullptr;
  };

  explicit CallGate(std::function<void()> finish) : _finish(std::move(finish)) {}
  CallGate(const CallGate&) = delete;
  CallGate& operator=(const CallGate&) = delete;

  // Throws std::invalid_argument ("<store>: <call> on a closed KV store") once closed.
  Pass enter(std::string_view call, const std::filesystem::path& store);

  // Refuses new calls. wait: returns once every call has left and the finish ran (here, or on
  // the thread of the last call). Without wait, the finish runs here only if no call is left.
  void close(bool wait);

 private:
  void leave() noexcept;
  void run_finish() noexcept;  // _claimed set by the caller, _mutex not held

  std::function<void()> _finish;
  std::mutex _mutex;
  std::condition_variable _changed;
  std::size_t _active = 0;
  bool _closed = false, _claimed = false, _finished = false;
};

// Tests: runs on a call's thread right after it entered (a latch there holds a call in flight).
// Set it before the calls start and clear it after they ended.
void set_call_hook_for_tests(std::function<void(std::string_view call)> hook);

}  // namespace ferry::detail::kv
