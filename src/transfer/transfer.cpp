// Tickets, the route and submission: the front of the transfer core.
#include "ferry/transfer.hpp"

#include <algorithm>
#include <chrono>

#include "shim/gds_mode.hpp"
#include "ferry/error.hpp"
#include "services/page_cache_registry.hpp"
#include "services/pinned_pool.hpp"
#include "transfer/backend.hpp"
#include "transfer/ticket_state.hpp"

namespace ferry {
namespace detail {

TicketState::TicketState(std::shared_ptr<const FileSet> files_, Direction direction_,
                         std::vector<Extent> extents_, TransferOptions options_)
    : files(std::move(files_)),
      direction(direction_),
      extents(std::move(extents_)),
      options(std::move(options_)),
      records(extents.size()) {
  progress = std::move(options.progress);
  options.progress = nullptr;
  reports_progress = static_cast<bool>(progress);
  for (const auto& x : extents)
    for (const auto& s : x.spans) progress_total += s.size;
}

void TicketState::fail(std::size_t e, std::exception_ptr error) {
  {
    std::lock_guard lock(mutex);
    if (!records[e].error) records[e].error = error;
    if (!first_error) first_error = error;
    if (options.stop_at_first_error) cancel = true;
  }
  records[e].pieces_left.fetch_sub(1);
  changed.notify_all();  // an observer waiting for this extent's earlier bytes
}

void TicketState::observe(std::size_t e, std::uint64_t offset, const std::byte* data,
                          std::uint64_t size) {
  if (!options.observer) return;
  using Clock = std::chrono::steady_clock;
  const auto nanoseconds = [](Clock::time_point from, Clock::time_point to) {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(to - from).count());
  };
  ExtentRecord& r = records[e];
  auto start = Clock::now();
  if (r.observed.load(std::memory_order_acquire) < offset) {
    // The earlier bytes are with a worker that took them before these (groups are taken in
    // order, and observed in order within one), so they come, or their extent fails.
    {
      std::unique_lock lock(mutex);
      observe_waiters.fetch_add(1);  // before the check: see the store's side below
      while (!(r.observed.load() >= offset || r.error || cancel.load() || job_lost))
        changed.wait_for(lock, std::chrono::milliseconds(20));
      observe_waiters.fetch_sub(1);
    }
    const auto now = Clock::now();
    observe_waiting_ns.fetch_add(nanoseconds(start, now), std::memory_order_relaxed);
    start = now;
  }
  const std::uint64_t seen = r.observed.load(std::memory_order_acquire);
  if (seen != offset) {
    // Seen already (a group redone piece by piece after a failure), or in part: then the rest
    // of the extent is never observed, and nobody waits for it.
    if (seen != kObservingAbandoned && seen > offset && seen < offset + size) {
      r.observed.store(kObservingAbandoned);
      wake_observers();
    }
    return;
  }
  options.observer(e, offset, data, size);
  observing_ns.fetch_add(nanoseconds(start, Clock::now()), std::memory_order_relaxed);
  r.observed.store(offset + size);  // sequentially consistent with the waiters' count
  wake_observers();
}

void TicketState::wake_observers() {
  // A waiter counts itself under the mutex before it checks; either it sees the store made
  // before this call, or this sees it counted and takes the mutex (it then waits already).
  if (observe_waiters.load() == 0) return;
  { std::lock_guard lock(mutex); }
  changed.notify_all();
}

bool TicketState::landed(std::size_t e, std::uint64_t bytes) {
  records[e].bytes.fetch_add(bytes);
  const bool last = records[e].pieces_left.fetch_sub(1) == 1;
  if (!reports_progress) return last;  // no lock per piece where nobody listens
  std::lock_guard lock(mutex);         // one call at a time, the count only growing
  if (progress) progress(progress_done += bytes, progress_total);
  return last;
}

void TicketState::copied_by(std::size_t e, std::int64_t key) {
  std::int64_t was = kNoCopier;
  auto& copier = records[e].copier;
  if (!copier.compare_exchange_strong(was, key) && was != key) copier = kSeveralCopiers;
}

void TicketState::job_queued(std::vector<PooledEvent> ends) {
  {
    std::lock_guard lock(mutex);
    for (auto& e : ends) queued.push_back(std::move(e));
    --jobs_queuing;
  }
  changed.notify_all();
}

void TicketState::job_finished() {
  {
    std::lock_guard lock(mutex);
    --jobs_running;
  }
  changed.notify_all();
}

void TicketState::wait() const {
  std::unique_lock lock(mutex);
  changed.wait(lock, [&] { return jobs_running == 0; });
  progress = nullptr;  // released here, by the caller, not by whichever worker ends last
  registration.reset();
}

Ticket start(const TransferBackend& backend, std::shared_ptr<TicketState> state) {
  backend.start(state);
  return Ticket(std::move(state));
}

Route choose_route(const FileSet& files, const Device& device, const TransferOptions& options) {
  Route route{&staged_backend(), {}};
  if (options.backend == Backend::Posix) return route;
  if (options.backend == Backend::DirectStorage) {
    const Verdict v = dstorage_backend().probe(files, device, options);
    if (v.usable) return {&dstorage_backend(), {}};
    // Never silent: without explicit permission the load fails with the reason.
    FERRY_EXPECT(options.allow_compat, std::invalid_argument, v.reason,
                 "; to take the staged path instead, allow it explicitly (allow_compat, "
                 "--allow-compat)");
    route.note = "DirectStorage not used (the staged path was allowed instead): " + v.reason;
    return route;
  }
  FERRY_EXPECT(device.is_cuda() || options.backend != Backend::Cufile, std::invalid_argument,
               "the cufile backend moves GPU memory: it needs --device cuda:N");
  if (!device.is_cuda()) return route;
  // Without nvidia-fs no file can get true GPUDirect Storage: auto need not start cuFile.
  if (options.backend == Backend::Auto && !nvidia_fs_present()) {
    route.note = "cuFile not used: no nvidia-fs driver, so no GPUDirect Storage";
    return route;
  }
  const Verdict v = cufile_backend().probe(files, device, options);
  if (v.usable) {
    route.backend = &cufile_backend();
    return route;
  }
  if (options.backend == Backend::Cufile) {
    if (v.no_driver) fail<CudaError>(v.reason);
    fail<std::invalid_argument>(v.reason);
  }
  route.note = "cuFile not used: " + v.reason;
  return route;
}

std::span<const TransferBackend* const> backends() {
  static const TransferBackend* const table[] = {&cufile_backend(), &dstorage_backend(),
                                                 &staged_backend()};
  return table;
}

}  // namespace detail

Ticket::Ticket(std::shared_ptr<detail::TicketState> state) : _state(std::move(state)) {}

Ticket& Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    if (_state) _state->wait();
    _state = std::move(other._state);
  }
  return *this;
}

Ticket::~Ticket() {
  if (_state) _state->wait();
}

void Ticket::wait() const {
  if (_state) _state->wait();
}

bool Ticket::wait_for(double seconds) const {
  if (!_state) return true;
  std::unique_lock lock(_state->mutex);
  return _state->changed.wait_for(lock, std::chrono::duration<double>(seconds),
                                  [&] { return _state->jobs_running == 0; });
}

bool Ticket::ready() const {
  if (!_state) return true;
  std::lock_guard lock(_state->mutex);
  return _state->jobs_running == 0;
}

void Ticket::cancel() {
  if (!_state) return;
  // Not under the mutex: cancel() may be called from the progress callback, which holds it.
  // An observer that misses this wake-up sees the flag at its next timed look.
  _state->cancel = true;
  _state->changed.notify_all();
}

bool Ticket::cancelled() const { return _state && _state->cancel.load(); }

std::size_t Ticket::extent_count() const { return _state ? _state->extents.size() : 0; }

ExtentStatus Ticket::status(std::size_t extent) const {
  FERRY_EXPECT(_state && extent < _state->extents.size(), std::out_of_range, "extent ", extent,
               " is not in this ticket");
  const auto& r = _state->records[extent];
  ExtentStatus s;
  s.bytes_done = r.bytes.load();
  std::lock_guard lock(_state->mutex);
  if (r.error) {
    s.state = ExtentStatus::State::Failed;
    try {
      std::rethrow_exception(r.error);
    } catch (const std::exception& e) {
      s.error = e.what();
    } catch (...) {
      s.error = "unknown error";
    }
  } else if (r.pieces_left.load() == 0) {
    s.state = ExtentStatus::State::Done;
  } else if (_state->jobs_running == 0) {
    s.state = ExtentStatus::State::Cancelled;
    if (!_state->cancel && _state->first_error) {
      s.state = ExtentStatus::State::Failed;
      try {
        std::rethrow_exception(_state->first_error);
      } catch (const std::exception& e) {
        s.error = e.what();
      } catch (...) {
        s.error = "unknown error";
      }
    }
  }
  return s;
}

std::uint64_t Ticket::bytes_done() const {
  std::uint64_t total = 0;
  if (_state)
    for (const auto& r : _state->records) total += r.bytes.load();
  return total;
}

void Ticket::rethrow_if_failed() const {
  if (!_state) return;
  std::exception_ptr error;
  {
    std::lock_guard lock(_state->mutex);
    error = _state->first_error;
  }
  if (error) std::rethrow_exception(error);
  if (_state->cancel)
    for (const auto& r : _state->records)
      FERRY_EXPECT(r.pieces_left.load() == 0, Cancelled, "the transfer was cancelled");
}

void Ticket::order_before(void* cu_stream) const {
  if (!_state) return;
  std::unique_lock lock(_state->mutex);
  _state->changed.wait(lock, [&] { return _state->jobs_queuing == 0; });
  for (const auto& e : _state->queued)
    FERRY_CU(cuStreamWaitEvent, static_cast<shim::cu::Stream>(cu_stream), e->get(), 0);
}

const TransferStats& Ticket::stats() const {
  static const TransferStats none;
  if (!_state) return none;
  _state->wait();
  return _state->stats;
}

Ticket submit(std::shared_ptr<const FileSet> files, Direction direction,
              std::vector<Extent> extents, const TransferOptions& options) {
  FERRY_EXPECT(files != nullptr, std::invalid_argument, "submit: no file set given");
  FERRY_EXPECT(options.staging_bytes > 0, std::invalid_argument, "submit: zero staging bytes");
  Device device = Device::cpu();
  const std::size_t file_count = files->size();
  for (const Extent& x : extents) {
    FERRY_EXPECT(x.file < file_count, std::invalid_argument, "submit: file index ", x.file,
                 " is not in the file set of ", file_count);
    for (const MemorySpan& s : x.spans) {
      FERRY_EXPECT(s.data != nullptr ||
                       (direction == Direction::FileToMemory && !s.device.is_cuda()) || s.size == 0,
                   std::invalid_argument, "submit: a span of ", s.size,
                   " bytes has no memory (holes are for file -> memory only)");
      if (s.device.is_cuda()) device = s.device;
    }
  }
  if (!device.is_cuda()) device = options.destination.device;
  const auto started = std::chrono::steady_clock::now();
  const detail::Route route = detail::choose_route(*files, device, options);
  auto state = std::make_shared<detail::TicketState>(std::move(files), direction,
                                                     std::move(extents), options);
  if (route.backend == &detail::cufile_backend() && options.destination.data) {
    state->registration = std::make_unique<detail::RegisteredBuffer>(
        reinterpret_cast<std::uintptr_t>(options.destination.data), options.destination.size);
    state->registered_base = state->registration->base();
  }
  state->stats.note = route.note;
  state->stats.route_note = route.note;
  state->stats.route_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return detail::start(*route.backend, std::move(state));
}

void set_staging_limit(std::uint64_t bytes) { detail::staging_pool().set_bound(bytes); }
std::uint64_t staging_limit() { return detail::staging_pool().bound(); }
std::uint64_t staging_high_water() { return detail::staging_pool().stats().high_water; }

std::uint64_t release_page_cache_registrations() {
  detail::PageCacheRegistry& registry = detail::page_cache_registry();
  registry.release_idle();
  return registry.registered_bytes();
}

}  // namespace ferry
