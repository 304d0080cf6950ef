#include "services/worker_pool.hpp"

#include <new>
#include <system_error>

#include "platform/system.hpp"

namespace ferry::detail {

WorkerPool::WorkerPool(unsigned cap, StartThread start)
    : _start(std::move(start)), _cap(std::max(1u, cap)) {
  if (!_start) _start = [](std::function<void()> body) { return std::thread(std::move(body)); };
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard lock(_mutex);
    _stopping = true;
  }
  _wake.notify_all();
  for (auto& t : _threads) t.join();
}

bool WorkerPool::grow_locked() {
  try {
    _threads.push_back(_start([this] { run_thread(); }));
    ++_starting;
    return true;
  } catch (const std::system_error& e) {
    _failure = "the system refused a thread (" + std::string(e.what()) + ") beyond " +
               std::to_string(_threads.size());
    return false;
  }
}

unsigned WorkerPool::reserve(unsigned wanted) {
  std::lock_guard lock(_mutex);
  wanted = std::min(wanted, _cap);
  while (_threads.size() < wanted && grow_locked()) {
  }
  return static_cast<unsigned>(_threads.size());
}

void WorkerPool::post(std::function<void()> job) {
  {
    std::unique_lock lock(_mutex);
    _jobs.push_back(std::move(job));
    if (_jobs.size() > _idle + _starting && _threads.size() < _cap) grow_locked();
    if (!_threads.empty()) {
      lock.unlock();
      _wake.notify_one();
      return;
    }
    job = std::move(_jobs.back());
    _jobs.pop_back();
  }
  job();  // no thread at all: the caller's thread does the work
}

void WorkerPool::post(const std::function<void()>& job, unsigned count) {
  if (count == 0) return;
  {
    std::lock_guard lock(_mutex);
    for (unsigned i = 0; i < count; ++i) _jobs.push_back(job);
    while (_jobs.size() > _idle + _starting && _threads.size() < _cap && grow_locked()) {
    }
    if (!_threads.empty()) {
      if (count == 1) {
        _wake.notify_one();
      } else {
        _wake.notify_all();
      }
      return;
    }
    _jobs.erase(_jobs.end() - count, _jobs.end());  // no thread at all: the caller runs them
  }
  for (unsigned i = 0; i < count; ++i) job();
}

void WorkerPool::run_thread() {
  std::unique_lock lock(_mutex);
  --_starting;
  for (;;) {
    ++_idle;
    _wake.wait(lock, [&] { return _stopping || !_jobs.empty(); });
    --_idle;
    if (_jobs.empty()) return;  // stopping, nothing left
    std::function<void()> job = std::move(_jobs.front());
    _jobs.pop_front();
    lock.unlock();
    job();  // jobs catch their own errors
    lock.lock();
  }
}

unsigned WorkerPool::threads() const {
  std::lock_guard lock(_mutex);
  return static_cast<unsigned>(_threads.size());
}

std::string WorkerPool::last_failure() const {
  std::lock_guard lock(_mutex);
  return _failure;
}

void WorkerPool::forget_threads_after_fork() noexcept {
  // Only the forking thread exists in the child: the others' handles are leaked, never joined.
  new std::vector<std::thread>(std::move(_threads));
  _threads.clear();
  _jobs.clear();
  _idle = 0;
  _starting = 0;
  // The condition variable still counts the parent's waiting threads, which the child lacks:
  // a notify could go to one of them. A fresh one starts clean (the old state is dropped).
  new (&_wake) std::condition_variable();
}

WorkerPool& transfer_workers() {
  static WorkerPool* pool = [] {
    auto* p = new WorkerPool(kMaxWorkerThreads);
    // A child of fork() gets a pool with no threads, which makes them again on demand; the
    // lock is held across the fork so that the child never inherits it mid-change.
    static WorkerPool* forked = p;
    at_fork([] { forked->_mutex.lock(); }, [] { forked->_mutex.unlock(); },
            [] {
              forked->forget_threads_after_fork();
              forked->_mutex.unlock();
            });
    return p;
  }();
  return *pool;
}

}  // namespace ferry::detail
