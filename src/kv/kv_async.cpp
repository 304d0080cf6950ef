// The asynchronous forms of KVStore: put_async/get_async run the batch on the store's worker
// threads (kv/async_runner.hpp) and complete a KVTicket with the per-key results.
#include <chrono>

#include "ferry/error.hpp"
#include "ferry/kv_store.hpp"
#include "kv/kv_store_impl.hpp"
#include "platform/system.hpp"

namespace ferry {
namespace detail {
namespace {

// Completion callbacks running on this thread (one may wait for a ticket whose batch runs a
// callback of its own, inline: see AsyncRunner::run_one_here).
thread_local int callbacks_running = 0;

}  // namespace

// A ticket's results are final before its callback runs, and the ticket is done after it: a
// wait from inside a callback (the ticket's own, or any other) ends when the results are final,
// so a callback asking its own ticket, or two callbacks asking each other's, never hang.
struct KVTicketState {
  std::mutex mutex;
  std::condition_variable changed;
  bool final = false, done = false;
  std::vector<KVResult> results;

  void finish(std::vector<KVResult> out, const KVCallback& callback) {
    {
      std::lock_guard lock(mutex);
      results = std::move(out);
      final = true;
      changed.notify_all();
    }
    if (callback) {
      ++callbacks_running;
      try {
        callback(results);  // final: never written again
      } catch (...) {
        // A callback's own failure is the caller's: the results stand.
      }
      --callbacks_running;
    }
    std::lock_guard lock(mutex);
    done = true;
    changed.notify_all();
  }
  bool reached() const { return callbacks_running > 0 ? final : done; }
};

namespace kv {
namespace {
thread_local const void* current_state = nullptr;  // the runner state this thread serves
}  // namespace

AsyncRunner::AsyncRunner(unsigned threads) : _wanted(threads), _state(std::make_shared<State>()) {}

AsyncRunner::~AsyncRunner() {
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(_state->mutex);
    _state->stopping = true;
    threads = std::move(_threads);
  }
  _state->changed.notify_all();
  for (auto& t : threads) {
    if (t.get_id() == std::this_thread::get_id())
      t.detach();  // ends once the job it runs now returns (it holds the state)
    else
      t.join();
  }
}

void AsyncRunner::post(std::function<void()> job) {
  {
    std::lock_guard lock(_state->mutex);
    _state->jobs.push_back(std::move(job));
    if (_threads.size() < _wanted) _threads.emplace_back(run, _state);
  }
  _state->changed.notify_one();
}

bool AsyncRunner::on_this_thread() const { return current_state == _state.get(); }

bool AsyncRunner::run_one_here() {
  auto* state = static_cast<State*>(const_cast<void*>(current_state));
  if (!state) return false;
  std::function<void()> job;
  {
    std::lock_guard lock(state->mutex);
    if (state->jobs.empty()) return false;
    job = std::move(state->jobs.front());
    state->jobs.pop_front();
  }
  job();
  return true;
}

void AsyncRunner::run(std::shared_ptr<State> state) {
  current_state = state.get();
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock lock(state->mutex);
      state->changed.wait(lock, [&] { return state->stopping || !state->jobs.empty(); });
      if (state->jobs.empty()) return;  // stopping, and nothing left
      job = std::move(state->jobs.front());
      state->jobs.pop_front();
    }
    job();
  }
}

}  // namespace kv
}  // namespace detail

namespace {

// Batches of one store run on this many threads at once. Host-memory batches overlap their I/O
// and syncs (vLLM's KV tier queues many 16-block jobs: 4 loaded 1.2 x faster than 2 on a 2-core
// machine); GPU batches queue on the GPU path's mutex, each parallel in the transfer core.
constexpr unsigned kAsyncThreads = 4;

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
  // A worker thread runs its store's queued batches meanwhile: the one waited for may be there.
  while (!ready() && detail::kv::AsyncRunner::run_one_here()) {
  }
  std::unique_lock lock(_state->mutex);
  _state->changed.wait(lock, [&] { return _state->reached(); });
}

bool KVTicket::wait_for(double seconds) const {
  if (!_state) return true;
  while (!ready() && detail::kv::AsyncRunner::run_one_here()) {
  }
  std::unique_lock lock(_state->mutex);
  return _state->changed.wait_for(lock, std::chrono::duration<double>(seconds),
                                  [&] { return _state->reached(); });
}

bool KVTicket::ready() const {
  if (!_state) return true;
  std::lock_guard lock(_state->mutex);
  return _state->reached();
}

const std::vector<KVResult>& KVTicket::results() const {
  static const std::vector<KVResult> none;
  if (!_state) return none;
  wait();
  return _state->results;
}

// A batch holds the store (deferred destruction: its last owner may let go in the callback) and
// a pass of its gate from its post until its callback returned.
KVTicket KVStore::Impl::post_batch(const char* call, std::size_t keys, KVCallback done,
                                   std::function<std::vector<KVResult>(Impl&)> batch) {
  auto pass = std::make_shared<detail::kv::CallGate::Pass>(enter(call));
  auto state = std::make_shared<detail::KVTicketState>();
  runner().post([impl = shared_from_this(), pass, state, keys, done = std::move(done),
                 batch = std::move(batch)]() mutable {
    std::vector<KVResult> results;
    try {
      results = batch(*impl);
    } catch (const std::exception& e) {
      results = failed_all(keys, e);
    }
    state->finish(std::move(results), done);
    done = nullptr;  // the callback's captures go before the batch counts as ended
    batch = nullptr;
    pass.reset();
  });
  return KVTicket(state);
}

KVTicket KVStore::put_async(std::vector<KVKey> keys, KVBlockList sources, KVPutOptions options,
                            KVCallback done) {
  FERRY_EXPECT(keys.size() == sources.size(), std::invalid_argument, "KV put: ", keys.size(),
               " keys but ", sources.size(), " sources");
  _impl->check_process("put_async");
  const std::size_t n = keys.size();
  return _impl->post_batch("put_async", n, std::move(done),
                    [keys = std::move(keys), sources = std::move(sources), options](Impl& impl) {
                      std::vector<KVBlock> blocks(sources.begin(), sources.end());
                      return impl.put(keys, blocks, options);
                    });
}

KVTicket KVStore::get_async(std::vector<KVKey> keys, KVBlockList destinations, KVCallback done) {
  FERRY_EXPECT(keys.size() == destinations.size(), std::invalid_argument, "KV get: ", keys.size(),
               " keys but ", destinations.size(), " destinations");
  _impl->check_process("get_async");
  const std::size_t n = keys.size();
  return _impl->post_batch("get_async", n, std::move(done),
                    [keys = std::move(keys), destinations = std::move(destinations)](Impl& impl) {
                      std::vector<KVBlock> blocks(destinations.begin(), destinations.end());
                      return impl.get(keys, blocks);
                    });
}

}  // namespace ferry
