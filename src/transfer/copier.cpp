#include "transfer/copier.hpp"

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

// One stream per device and thread, made on first use and kept: the pool's threads live for
// the process, so their streams are never made twice. Leaked on purpose, never destroyed from a
// thread-exit or static destructor that could run after the driver.
Stream& thread_stream(int ordinal) {
  thread_local auto* streams = new std::map<int, std::unique_ptr<Stream>>;
  auto& s = (*streams)[ordinal];
  if (!s) s = std::make_unique<Stream>();
  return *s;
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
  static auto* pool = new EventPool;  // leaked: see thread_stream
  return *pool;
}

class CudaCopier final : public Copier {
 public:
  CudaCopier(int ordinal, unsigned slots) : _ordinal(ordinal) {
    device_context(ordinal).make_current();
    _stream = &thread_stream(ordinal);
    _fences = event_pool().take(ordinal, slots);
  }
  ~CudaCopier() override {
    drain();
    event_pool().give(_ordinal, _fences);
  }
  void put(std::uintptr_t memory, const std::byte* staging, std::uint64_t size) override {
    FERRY_CU(cuMemcpyHtoDAsync, memory, staging, size, _stream->get());
  }
  void get(std::byte* staging, std::uintptr_t memory, std::uint64_t size) override {
    FERRY_CU(cuMemcpyDtoHAsync, staging, memory, size, _stream->get());
  }
  void fence(unsigned slot) override { _fences[slot].record(*_stream); }
  void wait(unsigned slot) override { _fences[slot].synchronize(); }
  void after(void* event) override {
    if (event) FERRY_CU(cuStreamWaitEvent, _stream->get(), static_cast<shim::cu::Event>(event), 0);
  }
  PooledEvent mark_end() override {
    auto taken = event_pool().take(_ordinal, 1);
    PooledEvent end(new Event(std::move(taken.front())), EventReturn{_ordinal});
    end->record(*_stream);
    return end;
  }
  void drain() noexcept override { shim::CudaDriver::get().cuStreamSynchronize(_stream->get()); }

 private:
  int _ordinal;
  Stream* _stream;
  std::vector<Event> _fences;
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

std::unique_ptr<Copier> make_copier(const Device& device, unsigned slots) {
  if (!device.is_cuda()) return std::make_unique<HostCopier>();
  return std::make_unique<CudaCopier>(device.index, slots);
}

void wait_for_event(const Device& device, void* event) { make_copier(device, 0)->after(event); }

}  // namespace ferry::detail
