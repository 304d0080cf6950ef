// The gate between C++ threads and a finalizing interpreter, shared by the binding files.
#pragma once

#include <Python.h>
#include <nanobind/nanobind.h>
#include <unistd.h>

#include <condition_variable>
#include <mutex>

namespace ferry {

namespace nb = nanobind;

// Threads that take the GIL from C++ (progress callbacks on reader threads, a load returning to
// its caller) must not do so once the interpreter finalizes: Python then ends them with
// pthread_exit, whose unwinding no C++ frame on their stack may stop (catch (...) in the engine
// and in nanobind would abort the process). An atexit handler, which runs before finalization,
// closes the gate and waits (without the GIL) for the threads already past it.
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

  // The atexit handler, called with the GIL held.
  void close() {
    {
      std::lock_guard lock(_mutex);
      _exiting = true;
    }
    nb::gil_scoped_release release;  // those inside may be waiting for the GIL
    std::unique_lock lock(_mutex);
    _idle.wait(lock, [this] { return _inside == 0; });
  }

 private:
  std::mutex _mutex;
  std::condition_variable _idle;
  bool _exiting = false;
  unsigned _inside = 0;
  unsigned long _main_thread = 0;
};

// Runs `body` with the GIL released. Where the interpreter began to exit meanwhile, the thread
// never takes the GIL back: it waits for the process to end, as Python 3.14 does itself.
template <class Body>
auto without_gil(Body&& body) -> decltype(body()) {
  struct Reacquire {
    PyThreadState* state;
    ~Reacquire() {
      if (!InterpreterExit::get().enter())
        for (;;) ::pause();
      PyEval_RestoreThread(state);
      InterpreterExit::get().leave();
    }
  } reacquire{PyEval_SaveThread()};
  return body();
}

}  // namespace ferry
