// A stand-in for nvcuda.dll, for tests under Wine: one "GPU" whose memory is host memory (device
// addresses are host addresses; copies are memcpy, done at once; streams and events are
// trivially complete), with the LUID 0x1234 that fake_dxgi.cpp gives its second adapter, and the
// external memory and semaphore imports of D3D12 objects made by fake_d3d12.cpp (their NT handles
// are file mappings: mapped here too, so both sides see the same bytes). Enough of the driver for
// ferry's loads and the DirectStorage bridge, nothing more.
#include <windows.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "shim/cuda_driver.hpp"

namespace cu = ferry::shim::cu;

namespace {
constexpr cu::Result kOk = 0;
constexpr cu::Result kInvalidValue = 1;
constexpr cu::Result kInvalidDevice = 101;
constexpr cu::Result kNotSupported = 801;
constexpr cu::Result kTimeout = 909;

struct ExternalMemory {
  std::byte* base;
  std::uint64_t size;
};
struct ExternalSemaphore {
  std::atomic<std::uint64_t>* value;
};
int dummy_object;

// Waits on the imported fence are asynchronous, as CUDA's are: a wait for a value the fence has
// not reached leaves the copies out of the imported buffer pending until a synchronisation, which
// waits (ten seconds at most) for the value, then runs them. A copy out of the buffer with no
// wait for the fence's latest value before it is refused: the tests see the order of calls.
ExternalMemory* imported_memory = nullptr;
ExternalSemaphore* imported_fence = nullptr;
std::mutex pending_mutex;
std::uint64_t last_waited = 0;    // satisfied waits
std::uint64_t pending_value = 0;  // a wait not yet satisfied (0: none)
std::vector<std::function<void()>> pending_copies;
cu::Result sticky = kOk;  // a refused pending copy, reported at the next synchronisation

bool reads_import(cu::DevicePtr from, std::size_t n) {
  if (!imported_memory) return false;
  const auto* at = reinterpret_cast<const std::byte*>(from);
  return at < imported_memory->base + imported_memory->size && at + n > imported_memory->base;
}

// Under pending_mutex. Runs the pending copies once their wait is satisfied.
cu::Result synchronise() {
  if (pending_value != 0) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (imported_fence->value->load() < pending_value)
      if (std::chrono::steady_clock::now() > deadline)
        return kTimeout;
      else
        std::this_thread::yield();
    last_waited = std::max(last_waited, pending_value);
    pending_value = 0;
    for (auto& copy : pending_copies) copy();
    pending_copies.clear();
  }
  return std::exchange(sticky, kOk);
}

// A copy: out of the imported buffer it waits behind a pending fence wait and needs one first.
cu::Result copy(cu::DevicePtr from, std::size_t n, std::function<void()> run) {
  if (!reads_import(from, n)) return run(), kOk;
  std::lock_guard lock(pending_mutex);
  if (pending_value != 0) {
    pending_copies.push_back(std::move(run));
    return kOk;
  }
  if (last_waited < imported_fence->value->load()) return kInvalidValue;
  return run(), kOk;
}
}  // namespace

#define FAKE_CUDA extern "C" __declspec(dllexport) cu::Result __stdcall

FAKE_CUDA cuInit(unsigned) { return kOk; }
FAKE_CUDA cuDriverGetVersion(int* v) { return *v = 13000, kOk; }
FAKE_CUDA cuGetErrorName(cu::Result, const char** s) { return *s = "CUDA_ERROR_STAND_IN", kOk; }
FAKE_CUDA cuGetErrorString(cu::Result, const char** s) {
  return *s = "an error of the stand-in driver", kOk;
}
FAKE_CUDA cuDeviceGetCount(int* n) { return *n = 1, kOk; }
FAKE_CUDA cuDeviceGet(cu::Device* d, int ordinal) {
  if (ordinal != 0) return kInvalidDevice;
  return *d = 0, kOk;
}
FAKE_CUDA cuDeviceGetName(char* name, int length, cu::Device) {
  std::strncpy(name, "Stand-in CUDA GPU", static_cast<std::size_t>(length));
  return kOk;
}
FAKE_CUDA cuDeviceGetAttribute(int* value, int, cu::Device) { return *value = 0, kOk; }
FAKE_CUDA cuDeviceGetLuid(char* luid, unsigned* node_mask, cu::Device) {
  const unsigned char bytes[8] = {0x34, 0x12, 0, 0, 0, 0, 0, 0};
  std::memcpy(luid, bytes, 8);
  return *node_mask = 1, kOk;
}
FAKE_CUDA cuDeviceTotalMem_v2(std::size_t* bytes, cu::Device) { return *bytes = 8ull << 30, kOk; }
FAKE_CUDA cuDevicePrimaryCtxRetain(cu::Context* c, cu::Device) {
  return *c = reinterpret_cast<cu::Context>(&dummy_object), kOk;
}
FAKE_CUDA cuDevicePrimaryCtxRelease_v2(cu::Device) { return kOk; }
FAKE_CUDA cuCtxSetCurrent(cu::Context) { return kOk; }
FAKE_CUDA cuMemGetInfo_v2(std::size_t* free, std::size_t* total) {
  *free = 4ull << 30;
  return *total = 8ull << 30, kOk;
}
FAKE_CUDA cuMemAlloc_v2(cu::DevicePtr* p, std::size_t bytes) {
  void* memory = _aligned_malloc(bytes ? bytes : 1, 256);
  if (!memory) return 2;  // out of memory
  return *p = reinterpret_cast<cu::DevicePtr>(memory), kOk;
}
FAKE_CUDA cuMemFree_v2(cu::DevicePtr p) { return _aligned_free(reinterpret_cast<void*>(p)), kOk; }
FAKE_CUDA cuMemHostRegister_v2(void*, std::size_t, unsigned) { return kOk; }
FAKE_CUDA cuMemHostUnregister(void*) { return kOk; }
FAKE_CUDA cuMemcpyHtoDAsync_v2(cu::DevicePtr to, const void* from, std::size_t n, cu::Stream) {
  return std::memcpy(reinterpret_cast<void*>(to), from, n), kOk;
}
FAKE_CUDA cuMemcpyDtoH_v2(void* to, cu::DevicePtr from, std::size_t n) {
  {
    std::lock_guard lock(pending_mutex);
    if (const cu::Result r = synchronise(); r != kOk) return r;
  }
  return std::memcpy(to, reinterpret_cast<const void*>(from), n), kOk;
}
FAKE_CUDA cuMemcpyDtoHAsync_v2(void* to, cu::DevicePtr from, std::size_t n, cu::Stream) {
  return copy(from, n, [=] { std::memcpy(to, reinterpret_cast<const void*>(from), n); });
}
FAKE_CUDA cuMemcpyDtoDAsync_v2(cu::DevicePtr to, cu::DevicePtr from, std::size_t n, cu::Stream) {
  return copy(from, n, [=] {
    std::memmove(reinterpret_cast<void*>(to), reinterpret_cast<const void*>(from), n);
  });
}
FAKE_CUDA cuMemsetD8Async(cu::DevicePtr to, unsigned char value, std::size_t n, cu::Stream) {
  return std::memset(reinterpret_cast<void*>(to), value, n), kOk;
}
FAKE_CUDA cuStreamCreate(cu::Stream* s, unsigned) {
  return *s = reinterpret_cast<cu::Stream>(&dummy_object), kOk;
}
FAKE_CUDA cuStreamDestroy_v2(cu::Stream) { return kOk; }
FAKE_CUDA cuStreamSynchronize(cu::Stream) {
  std::lock_guard lock(pending_mutex);
  return synchronise();
}
FAKE_CUDA cuStreamWaitEvent(cu::Stream, cu::Event, unsigned) { return kOk; }
FAKE_CUDA cuStreamIsCapturing(cu::Stream, int* status) { return *status = 0, kOk; }
FAKE_CUDA cuEventCreate(cu::Event* e, unsigned) {
  return *e = reinterpret_cast<cu::Event>(&dummy_object), kOk;
}
FAKE_CUDA cuEventDestroy_v2(cu::Event) { return kOk; }
FAKE_CUDA cuEventRecord(cu::Event, cu::Stream) { return kOk; }
FAKE_CUDA cuEventSynchronize(cu::Event) {
  std::lock_guard lock(pending_mutex);
  return synchronise();
}
FAKE_CUDA cuEventQuery(cu::Event) {
  std::lock_guard lock(pending_mutex);
  return synchronise();
}
FAKE_CUDA cuEventElapsedTime(float* ms, cu::Event, cu::Event) { return *ms = 0, kOk; }
FAKE_CUDA cuCtxEnablePeerAccess(cu::Context, unsigned) { return kOk; }
FAKE_CUDA cuMemcpy3DPeerAsync(const cu::Memcpy3DPeer*, cu::Stream) { return kNotSupported; }

FAKE_CUDA cuImportExternalMemory(cu::ExternalMemory* out, const cu::ExternalMemoryHandleDesc* d) {
  if (d->type != cu::kExternalMemoryHandleTypeD3D12Resource ||
      !(d->flags & cu::kExternalMemoryDedicated) || !d->handle.win32.handle)
    return kInvalidValue;
  void* view = ::MapViewOfFile(d->handle.win32.handle, FILE_MAP_ALL_ACCESS, 0, 0, 0);
  if (!view) return kInvalidValue;
  imported_memory = new ExternalMemory{static_cast<std::byte*>(view), d->size};
  *out = reinterpret_cast<cu::ExternalMemory>(imported_memory);
  return kOk;
}
FAKE_CUDA cuExternalMemoryGetMappedBuffer(cu::DevicePtr* p, cu::ExternalMemory m,
                                          const cu::ExternalMemoryBufferDesc* d) {
  auto* memory = reinterpret_cast<ExternalMemory*>(m);
  if (d->offset + d->size > memory->size) return kInvalidValue;
  return *p = reinterpret_cast<cu::DevicePtr>(memory->base + d->offset), kOk;
}
FAKE_CUDA cuDestroyExternalMemory(cu::ExternalMemory) { return kOk; }
FAKE_CUDA cuImportExternalSemaphore(cu::ExternalSemaphore* out,
                                    const cu::ExternalSemaphoreHandleDesc* d) {
  if (d->type != cu::kExternalSemaphoreHandleTypeD3D12Fence || !d->handle.win32.handle)
    return kInvalidValue;
  void* view = ::MapViewOfFile(d->handle.win32.handle, FILE_MAP_ALL_ACCESS, 0, 0, 0);
  if (!view) return kInvalidValue;
  imported_fence = new ExternalSemaphore{static_cast<std::atomic<std::uint64_t>*>(view)};
  *out = reinterpret_cast<cu::ExternalSemaphore>(imported_fence);
  return kOk;
}
// Copies run at once here, so a wait is a wait on the host, for at most ten seconds.
FAKE_CUDA cuWaitExternalSemaphoresAsync(const cu::ExternalSemaphore* semaphores,
                                        const cu::ExternalSemaphoreWaitParams* params,
                                        unsigned count, cu::Stream) {
  std::lock_guard lock(pending_mutex);
  for (unsigned i = 0; i < count; ++i) {
    if (reinterpret_cast<ExternalSemaphore*>(semaphores[i]) != imported_fence) return kInvalidValue;
    if (const cu::Result r = synchronise(); r != kOk) return r;  // one pending wait at a time
    if (imported_fence->value->load() >= params[i].params.fence.value)
      last_waited = std::max(last_waited, params[i].params.fence.value);
    else
      pending_value = params[i].params.fence.value;
  }
  return kOk;
}
FAKE_CUDA cuDestroyExternalSemaphore(cu::ExternalSemaphore) { return kOk; }
