// The asynchronous forms of KVStore: put_async/get_async run the batch on the store's worker
// threads (kv/async_runner.hpp) and complete a KVTicket with the per-key results.
#include <chrono>

#include "ferry/error.hpp"
#include "ferry/kv_store.hpp"
#include "kv/kv_store_impl.hpp"
#include "platform/system.hpp"

namespace ferry {
namespace detail {

struct KVTicketState {
  std::mutex mutex;
  std::condition_variable changed;
  bool done = false;
  std::vector<KVResult> results;

  void finish(std::vector<KVResult> out, const KVCallback& callback) {
    if (callback) {
      try {
        callback(out);
      } catch (...) {
        // A callback's own failure is the caller's: the results stand.
      }
    }
    {
      std::lock_guard lock(mutex);
      results = std::move(out);
      done = true;
    }
    changed.notify_all();
  }
};

namespace kv {

AsyncRunner::~AsyncRunner() {
  {
    std::lock_guard lock(_mutex);
    _stopping = true;
  }
  _changed.notify_all();
  for (auto& t : _threads) t.join();
}

void AsyncRunner::post(std::function<void()> job) {
  {
    std::lock_guard lock(_mutex);
    _jobs.push_back(std::move(job));
    if (_threads.size() < _wanted) _threads.emplace_back([this] { run(); });
  }
  _changed.notify_one();
}

void AsyncRunner::run() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock lock(_mutex);
      _changed.wait(lock, [&] { return _stopping || !_jobs.empty(); });
      if (_jobs.empty()) return;  // stopping, and nothing left
      job = std::move(_jobs.front());
      _jobs.pop_front();
    }
    job();
  }
}

}  // namespace kv
}  // namespace detail

namespace {

// Batches of one store run on this many threads at once (each batch is itself parallel in the
// transfer core); more would only queue on the store's locks and the GPU path's mutex.
constexpr unsigned kAsyncThreads = 2;

std::vector<KVResult> failed_all(std::size_t n, const std::exception& e) {
  return std::vector<KVResult>(n, KVResult{KVStatus::io_error, e.what(), KVRoute::none, {}});
}

}  // namespace

detail::kv::AsyncRunner& KVStore::Impl::runner() {
  std::lock_guard lock(mutex);
  if (async && async_pid != detail::process_id()) (void)async.release();  // a fork()ed child
  if (!async) {
    async = std::make_unique<detail::kv::AsyncRunner>(kAsyncThreads);
    async_pid = detail::process_id();
  }
  return *async;
}

void KVStore::Impl::forget_threads_after_fork() {
  // Joining threads that exist only in the parent would hang; their handles are leaked.
  if (async && async_pid != detail::process_id()) (void)async.release();
}

void KVStore::Impl::check_process(const char* call) const {
  if (options.read_only) return;  // a reader holds nothing of the parent's but open files
  const std::uint64_t now = detail::process_id();
  FERRY_EXPECT(now == opened_by, std::runtime_error, "KV ", call, " in process ", now, ": ",
               dir.string(), " was opened for writing by process ", opened_by,
               ", and a fork()ed child cannot write through it (its lock, journal position and "
               "index are the parent's); open the store in the child instead (read_only to share "
               "it with the parent's writer)");
}

KVTicket::KVTicket(std::shared_ptr<detail::KVTicketState> state) : _state(std::move(state)) {}

void KVTicket::wait() const {
  if (!_state) return;
  std::unique_lock lock(_state->mutex);
  _state->changed.wait(lock, [&] { return _state->done; });
}

bool KVTicket::wait_for(double seconds) const {
  if (!_state) return true;
  std::unique_lock lock(_state->mutex);
  return _state->changed.wait_for(lock, std::chrono::duration<double>(seconds),
                                  [&] { return _state->done; });
}

bool KVTicket::ready() const {
  if (!_state) return true;
  std::lock_guard lock(_state->mutex);
  return _state->done;
}

const std::vector<KVResult>& KVTicket::results() const {
  static const std::vector<KVResult> none;
  if (!_state) return none;
  wait();
  return _state->results;
}

KVTicket KVStore::put_async(std::vector<KVKey> keys, KVBlockList sources, KVPutOptions options,
                            KVCallback done) {
  FERRY_EXPECT(keys.size() == sources.size(), std::invalid_argument, "KV put: ", keys.size(),
               " keys but ", sources.size(), " sources");
  _impl->check_process("put_async");
  auto state = std::make_shared<detail::KVTicketState>();
  Impl* impl = _impl.get();
  impl->runner().post([impl, state, keys = std::move(keys), sources = std::move(sources), options,
                       done = std::move(done)] {
    std::vector<KVBlock> blocks(sources.begin(), sources.end());
    std::vector<KVResult> results;
    try {
      results = impl->put(keys, blocks, options);
    } catch (const std::exception& e) {
      results = failed_all(keys.size(), e);
    }
    state->finish(std::move(results), done);
  });
  return KVTicket(state);
}

KVTicket KVStore::get_async(std::vector<KVKey> keys, KVBlockList destinations, KVCallback done) {
  FERRY_EXPECT(keys.size() == destinations.size(), std::invalid_argument, "KV get: ", keys.size(),
               " keys but ", destinations.size(), " destinations");
  _impl->check_process("get_async");
  auto state = std::make_shared<detail::KVTicketState>();
  Impl* impl = _impl.get();
  impl->runner().post([impl, state, keys = std::move(keys), destinations = std::move(destinations),
                       done = std::move(done)] {
    std::vector<KVBlock> blocks(destinations.begin(), destinations.end());
    std::vector<KVResult> results;
    try {
      results = impl->get(keys, blocks);
    } catch (const std::exception& e) {
      results = failed_all(keys.size(), e);
    }
    state->finish(std::move(results), done);
  });
  return KVTicket(state);
}

}  // namespace ferry
