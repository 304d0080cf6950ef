#include "cuda/cuda_resources.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>

#include "ferry/error.hpp"
#include "platform/system.hpp"

namespace ferry::detail {
namespace {

constexpr std::size_t kPageBytes = 4096;

const shim::CudaDriver& usable_driver() {
  const auto& d = shim::CudaDriver::get();
  FERRY_EXPECT(d.usable, CudaError, "no usable CUDA device: ", d.why_unusable);
  return d;
}

std::byte* allocate_aligned(std::size_t bytes) {
  const std::size_t rounded = (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
  void* p = aligned_malloc(kPageBytes, rounded == 0 ? kPageBytes : rounded);
  if (p == nullptr) throw std::bad_alloc();
  return static_cast<std::byte*>(p);
}

}  // namespace

PrimaryContext::PrimaryContext(int ordinal) : _ordinal(ordinal) {
  const auto& d = usable_driver();
  FERRY_EXPECT(ordinal >= 0 && ordinal < d.device_count, CudaError, "cuda:", ordinal,
               " does not exist: this machine has ", d.device_count, " CUDA device(s)");
  FERRY_CU(cuDeviceGet, &_device, ordinal);
  FERRY_CU(cuDevicePrimaryCtxRetain, &_context, _device);
}

PrimaryContext::~PrimaryContext() {
  if (_context) shim::CudaDriver::get().cuDevicePrimaryCtxRelease(_device);
}

void PrimaryContext::make_current() const { FERRY_CU(cuCtxSetCurrent, _context); }

Stream::Stream() { FERRY_CU(cuStreamCreate, &_stream, shim::cu::kStreamNonBlocking); }

Stream::~Stream() {
  if (_stream) shim::CudaDriver::get().cuStreamDestroy(_stream);
}

void Stream::synchronize() const { FERRY_CU(cuStreamSynchronize, _stream); }

Event::Event(bool timed) {
  FERRY_CU(cuEventCreate, &_event, timed ? shim::cu::kEventDefault : shim::cu::kEventDisableTiming);
}

double Event::elapsed_seconds(const Event& start, const Event& end) {
  const auto& d = shim::CudaDriver::get();
  float ms = 0;
  if (!d.cuEventElapsedTime || !start._recorded || !end._recorded ||
      d.cuEventElapsedTime(&ms, start._event, end._event) != shim::cu::kSuccess)
    return 0;
  return ms / 1e3;
}

Event::~Event() {
  if (_event) shim::CudaDriver::get().cuEventDestroy(_event);
}

void Event::record(const Stream& stream) {
  FERRY_CU(cuEventRecord, _event, stream.get());
  _recorded = true;
}

void Event::synchronize() const {
  if (_recorded) FERRY_CU(cuEventSynchronize, _event);
}

RelaxedCaptureMode::RelaxedCaptureMode() noexcept {
  const auto& d = shim::CudaDriver::get();
  int mode = shim::cu::kStreamCaptureModeRelaxed;
  if (d.usable && d.cuThreadExchangeStreamCaptureMode &&
      d.cuThreadExchangeStreamCaptureMode(&mode) == shim::cu::kSuccess)
    _previous = mode;
}

RelaxedCaptureMode::~RelaxedCaptureMode() {
  if (_previous >= 0) shim::CudaDriver::get().cuThreadExchangeStreamCaptureMode(&_previous);
}

namespace {

constexpr std::size_t kHugePage = std::size_t{2} << 20;

// A mapping of at least `bytes` whose start (returned) is 2 MiB-aligned for sizes of 2 MiB or
// more; `region` and `region_bytes` are what free_pages takes.
std::byte* map_aligned(std::size_t bytes, void*& region, std::size_t& region_bytes) {
  bytes = std::max(bytes, kPageBytes);
  region_bytes = bytes < kHugePage ? bytes : bytes + kHugePage;  // room to align the start
  region = allocate_pages(region_bytes);
  if (region == nullptr) throw std::bad_alloc();
  if (bytes < kHugePage) return static_cast<std::byte*>(region);
  const auto start = (reinterpret_cast<std::uintptr_t>(region) + kHugePage - 1) / kHugePage * kHugePage;
  return reinterpret_cast<std::byte*>(start);
}

}  // namespace

HostBuffer::HostBuffer(std::size_t bytes, const PrimaryContext* pin_in) : _size(bytes) {
  _data = map_aligned(bytes, _region, _region_bytes);
  if (pin_in == nullptr) return;
  try {
    pin(*pin_in);
  } catch (...) {
    release();
    throw;
  }
}

std::size_t HostBuffer::mapped_size() const noexcept { return std::max(_size, kPageBytes); }

void HostBuffer::pin(const PrimaryContext& context) {
  if (_data == nullptr || (pinned() && _registrations.size() == 1)) return;
  unpin();
  pin_range(0, mapped_size(), context);
}

void HostBuffer::pin_range(std::size_t offset, std::size_t bytes, const PrimaryContext& context) {
  FERRY_EXPECT(_data != nullptr && offset % kPageBytes == 0 && bytes % kPageBytes == 0 &&
                   bytes > 0 && offset + bytes <= mapped_size(),
               std::invalid_argument, "pinning ", bytes, " bytes at offset ", offset,
               " of a host buffer of ", mapped_size());
  _registrations.reserve(_registrations.size() + 1);  // no throw between register and record
  context.make_current();
  FERRY_CU(cuMemHostRegister, _data + offset, bytes, shim::cu::kMemHostRegisterPortable);
  _registrations.push_back(_data + offset);
  _pinned_bytes += bytes;
}

void HostBuffer::fault_in(std::size_t offset, std::size_t bytes) noexcept {
  const std::size_t end = std::min(offset + bytes, mapped_size());
  // A write per page (volatile: not elided); the pages hold nothing yet that a write could spoil
  // where they are not yet faulted, and a faulted page keeps its byte.
  for (std::size_t at = offset; at < end; at += kPageBytes) {
    auto* p = reinterpret_cast<volatile std::byte*>(_data + at);
    *p = *p;
  }
}

void HostBuffer::unpin() noexcept {
  for (std::byte* r : _registrations) shim::CudaDriver::get().cuMemHostUnregister(r);
  _registrations.clear();
  _pinned_bytes = 0;
}

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    release();
    _data = std::exchange(other._data, nullptr);
    _size = std::exchange(other._size, 0);
    _region = std::exchange(other._region, nullptr);
    _region_bytes = std::exchange(other._region_bytes, 0);
    _pinned_bytes = std::exchange(other._pinned_bytes, 0);
    _registrations = std::move(other._registrations);
    other._registrations.clear();
  }
  return *this;
}

HostBuffer::~HostBuffer() { release(); }

void HostBuffer::release() noexcept {
  if (_data == nullptr) return;
  unpin();
  free_pages(_region, _region_bytes);
  _data = nullptr;
  _region = nullptr;
}

const PrimaryContext& device_context(int ordinal) {
  static std::mutex mutex;
  // Leaked on purpose: releasing a primary context at exit could call a driver already gone.
  static auto* contexts = new std::map<int, std::unique_ptr<PrimaryContext>>;
  std::lock_guard lock(mutex);
  auto& slot = (*contexts)[ordinal];
  if (!slot) slot = std::make_unique<PrimaryContext>(ordinal);
  return *slot;
}

std::shared_ptr<void> allocate_device_memory(std::shared_ptr<PrimaryContext> context,
                                             std::size_t bytes) {
  context->make_current();
  shim::cu::DevicePtr ptr = 0;
  // cuMemAlloc refuses zero bytes; an empty load still gets a distinct valid allocation.
  FERRY_CU(cuMemAlloc, &ptr, bytes == 0 ? 1 : bytes);
  return std::shared_ptr<void>(reinterpret_cast<void*>(ptr), [context](void* p) noexcept {
    // The freeing thread may have no current context; a failure here can only leak.
    try {
      context->make_current();
      shim::CudaDriver::get().cuMemFree(reinterpret_cast<shim::cu::DevicePtr>(p));
    } catch (...) {
    }
  });
}

std::shared_ptr<void> allocate_host_memory(std::size_t bytes) {
  // Large destinations start on a 2 MiB boundary inside pages that ask for transparent huge
  // pages (platform/): every fresh 4 KiB page costs a fault, and those faults were a third of a
  // warm host load's time. The advice may be refused: 4 KiB pages then.
  if (bytes < kHugePage)
    return std::shared_ptr<void>(allocate_aligned(bytes), [](void* p) { aligned_free(p); });
  const std::size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  const std::size_t mapped = rounded + kHugePage;  // room to align the start
  void* region = allocate_pages(mapped);
  if (region == nullptr) throw std::bad_alloc();
  const std::uintptr_t start =
      (reinterpret_cast<std::uintptr_t>(region) + kHugePage - 1) / kHugePage * kHugePage;
  return std::shared_ptr<void>(reinterpret_cast<void*>(start),
                               [region, mapped](void*) { free_pages(region, mapped); });
}

}  // namespace ferry::detail
