// The gate between C++ threads and a finalizing interpreter, shared by the binding files.
#pragma once

#include <Python.h>
#include <nanobind/nanobind.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace ferry {

namespace nb = nanobind;

// Threads that take the GIL from C++ (progress callbacks on reader threads, a load returning to
// its caller) must not do so once the interpreter finalizes: Python then ends them with
// pthread_exit, whose unwinding no C++ frame on their stack may stop (catch (...) in the engine
// and in nanobind would abort the process). An atexit handler, which runs before finalization,
// closes the gate and waits (without the GIL) for the threads already past it.
// It also waits, for a bounded time, for the calls that run without the GIL on other threads
// (daemon threads') to end: after finalization the process runs its static destructors and the
// libraries' exit handlers, which must not race with work still in flight (a load of a daemon
// thread aborted the process there now and then). Loads see the exit and cancel.
class InterpreterExit {
 public:
  static InterpreterExit& get() {
    static auto* gate = new InterpreterExit;  // never destroyed: threads may outlive statics
    return *gate;
  }

  // Before taking the GIL: false once the interpreter is exiting, except on the main thread
  // (the one that finalizes: Python never ends it, and an atexit handler may load).
  bool enter() {
    std::lock_guard lock(_mutex);
    if (_exiting && PyThread_get_thread_ident() != _main_thread) return false;
    ++_inside;
    return true;
  }
  void set_main_thread(unsigned long ident) { _main_thread = ident; }
  void leave() {
    std::lock_guard lock(_mutex);
    if (--_inside == 0) _idle.notify_all();
  }

  // Around a call's work without the GIL.
  void begin_call() {
    std::lock_guard lock(_mutex);
    ++_calls;
  }
  void end_call() {
    std::lock_guard lock(_mutex);
    if (--_calls == 0) _idle.notify_all();
  }

  // The atexit handler, called with the GIL held (on the main thread, which runs no call then).
  void close() {
    bool parking = false;
    {
      std::lock_guard lock(_mutex);
      _exiting = true;
      parking = _calls > 0;
    }
    {
      nb::gil_scoped_release release;  // those inside may be waiting for the GIL
      std::unique_lock lock(_mutex);
      _idle.wait(lock, [this] { return _inside == 0; });
      // Work that cannot be cancelled (a KV put under way) gets this long; then the exit goes on.
      _idle.wait_for(lock, kCallDrain, [this] { return _calls == 0; });
    }
    // The threads of those calls stay parked with their arguments: not leaks to report.
    if (parking) nb::set_leak_warnings(false);
  }

 private:
  std::mutex _mutex;
  std::condition_variable _idle;
  bool _exiting = false;
  static constexpr std::chrono::seconds kCallDrain{10};
  unsigned _inside = 0;
  unsigned _calls = 0;
  unsigned long _main_thread = 0;
};

// Runs `body` with the GIL released. Where the interpreter began to exit meanwhile, the thread
// never takes the GIL back: it waits for the process to end, as Python 3.14 does itself.
template <class Body>
auto without_gil(Body&& body) -> decltype(body()) {
  struct Reacquire {
    PyThreadState* state;
    ~Reacquire() {
      InterpreterExit::get().end_call();
      if (!InterpreterExit::get().enter())
        for (;;) ::pause();
      PyEval_RestoreThread(state);
      InterpreterExit::get().leave();
    }
  } reacquire{PyEval_SaveThread()};
  InterpreterExit::get().begin_call();
  return body();
}

}  // namespace ferry
