#include "transfer/staged/copier.hpp"

#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "cuda/cuda_resources.hpp"
#include "ferry/error.hpp"

namespace ferry::detail {
namespace {

class HostCopier final : public Copier {
 public:
  void put(std::uintptr_t memory, const std::byte* staging, std::uint64_t size) override {
    std::memcpy(reinterpret_cast<void*>(memory), staging, size);
  }
  void get(std::byte* staging, std::uintptr_t memory, std::uint64_t size) override {
    std::memcpy(staging, reinterpret_cast<const void*>(memory), size);
  }
  void fence(unsigned) override {}
  void wait(unsigned) override {}
  void after(void* event) override {
    if (event) FERRY_CU(cuEventSynchronize, static_cast<shim::cu::Event>(event));
  }
  PooledEvent mark_end() override { return nullptr; }
  void drain() noexcept override {}
};

// Streams per device, made on first need and kept: a copier borrows one for a job and gives it
// back drained, so a worker thread the pool makes late (several submissions at once) costs no
// stream creation, a driver call that can take milliseconds while other threads copy. Leaked on
// purpose, never destroyed from a static destructor that could run after the driver.
class StreamPool {
 public:
  Stream* take(int ordinal) {
    {
      std::lock_guard lock(_mutex);
      auto& free = _free[ordinal];
      if (!free.empty()) {
        Stream* s = free.back();
        free.pop_back();
        return s;
      }
    }
    return new Stream;  // in the device's context, made current by the caller
  }
  void give(int ordinal, Stream* stream) {
    std::lock_guard lock(_mutex);
    _free[ordinal].push_back(stream);
  }

 private:
  std::mutex _mutex;
  std::map<int, std::vector<Stream*>> _free;
};

StreamPool& stream_pool() {
  static auto* pool = new StreamPool;  // leaked: see above
  return *pool;
}

// Events cost a driver call to make; submissions borrow them and give them back.
class EventPool {
 public:
  std::vector<Event> take(int ordinal, unsigned n) {
    std::vector<Event> out;
    {
      std::lock_guard lock(_mutex);
      auto& free = _free[ordinal];
      while (out.size() < n && !free.empty()) {
        out.push_back(std::move(free.back()));
        free.pop_back();
      }
    }
    while (out.size() < n) out.emplace_back();
    return out;
  }
  void give(int ordinal, Event&& event) {
    std::lock_guard lock(_mutex);
    _free[ordinal].push_back(std::move(event));
  }
  void give(int ordinal, std::vector<Event>& events) {
    std::lock_guard lock(_mutex);
    for (auto& e : events) _free[ordinal].push_back(std::move(e));
    events.clear();
  }

 private:
  std::mutex _mutex;
  std::map<int, std::vector<Event>> _free;
};

EventPool& event_pool() {
  static auto* pool = new EventPool;  // leaked: see StreamPool
  return *pool;
}

class CudaCopier final : public Copier {
 public:
  CudaCopier(int ordinal, unsigned slots, bool timed, CopyStreams* shared, unsigned worker)
      : _ordinal(ordinal), _context(&device_context(ordinal)), _timed(timed), _own(!shared) {
    _context->make_current();
    _stream = shared ? shared->stream(ordinal, worker) : stream_pool().take(ordinal);
    try {
      _fences = event_pool().take(ordinal, slots);
    } catch (...) {
      if (_own) stream_pool().give(ordinal, _stream);
      throw;
    }
  }
  ~CudaCopier() override {
    drain();
    event_pool().give(_ordinal, _fences);
    if (_own) stream_pool().give(_ordinal, _stream);
  }
  // A job may hold copiers of several devices on one thread: each call makes its own device's
  // context current (a thread-local set in the driver), so streams and events match it.
  void put(std::uintptr_t memory, const std::byte* staging, std::uint64_t size) override {
    _context->make_current();
    if (_timed) open_timing();
    FERRY_CU(cuMemcpyHtoDAsync, memory, staging, size, _stream->get());
  }
  void get(std::byte* staging, std::uintptr_t memory, std::uint64_t size) override {
    _context->make_current();
    if (_timed) open_timing();
    FERRY_CU(cuMemcpyDtoHAsync, staging, memory, size, _stream->get());
  }
  void fence(unsigned slot) override {
    _fences[slot].record(*_stream);
    if (_timed && _open) {
      _timings.back().second.record(*_stream);
      _open = false;
    }
  }
  std::vector<std::pair<double, double>> timed_copies(const Event& reference) override {
    std::vector<std::pair<double, double>> out;
    for (auto& [start, end] : _timings) {
      const double b = Event::elapsed_seconds(reference, start);
      const double e = Event::elapsed_seconds(reference, end);
      if (e > 0) out.emplace_back(b, e);
    }
    return out;
  }
  void record(Event& reference) override {
    _context->make_current();
    reference.record(*_stream);
  }
  void wait(unsigned slot) override { _fences[slot].synchronize(); }
  void after(void* event) override {
    _context->make_current();
    if (event) FERRY_CU(cuStreamWaitEvent, _stream->get(), static_cast<shim::cu::Event>(event), 0);
  }
  PooledEvent mark_end() override {
    _context->make_current();
    auto taken = event_pool().take(_ordinal, 1);
    PooledEvent end(new Event(std::move(taken.front())), EventReturn{_ordinal});
    end->record(*_stream);
    return end;
  }
  void drain() noexcept override { shim::CudaDriver::get().cuStreamSynchronize(_stream->get()); }

 private:
  // Starts a timed run of copies at the first copy after a fence.
  void open_timing() {
    if (_open) return;
    _timings.emplace_back(Event(true), Event(true));
    _timings.back().first.record(*_stream);
    _open = true;
  }

  // First member: relaxed before any driver call of the copier, restored after the last.
  RelaxedCaptureMode _relaxed;
  int _ordinal;
  const PrimaryContext* _context;
  Stream* _stream;
  std::vector<Event> _fences;
  bool _timed = false;
  bool _own = true;    // the stream is this copier's, not shared
  bool _open = false;  // a timed run started and not fenced yet
  std::vector<std::pair<Event, Event>> _timings;
};

}  // namespace

void EventReturn::operator()(Event* event) const noexcept {
  try {
    event_pool().give(ordinal, std::move(*event));
  } catch (...) {
    // No memory to keep it: destroyed below instead.
  }
  delete event;
}

CopyStreams::~CopyStreams() {
  for (auto& [ordinal, streams] : _streams)
    for (Stream* s : streams) {
      try {
        stream_pool().give(ordinal, s);
      } catch (...) {
        // No memory to keep it: leaked, never destroyed under a copy.
      }
    }
}

Stream* CopyStreams::stream(int ordinal, unsigned worker) {
  std::lock_guard lock(_mutex);
  auto& streams = _streams[ordinal];
  while (streams.size() < _count) streams.push_back(stream_pool().take(ordinal));
  return streams[worker % _count];
}

std::unique_ptr<Copier> make_copier(const Device& device, unsigned slots, bool timed,
                                    CopyStreams* shared, unsigned worker) {
  if (!device.is_cuda()) return std::make_unique<HostCopier>();
  return std::make_unique<CudaCopier>(device.index, slots, timed, shared, worker);
}

}  // namespace ferry::detail
