// A stand-in for nvcuda.dll, for tests under Wine: one "GPU" whose memory is host memory (device
// addresses are host addresses; copies are memcpy, done at once; streams and events are
// trivially complete), with the LUID 0x1234 that fake_dxgi.cpp gives its second adapter, and the
// external memory and semaphore imports of D3D12 objects made by fake_d3d12.cpp (their NT handles
// are file mappings: mapped here too, so both sides see the same bytes). Enough of the driver for
// ferry's loads and the DirectStorage bridge, nothing more; a copy out of the imported buffer
// before a wait for the fence's latest value is refused, so the tests see the order of calls.
#include <windows.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>

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

// The ordering check: a copy out of imported memory is refused unless the stream has waited for
// the fence's latest value (copies run at once here, so "latest" is "now").
ExternalMemory* imported_memory = nullptr;
ExternalSemaphore* imported_fence = nullptr;
std::atomic<std::uint64_t> last_waited{0};

bool reads_unwaited_import(cu::DevicePtr from, std::size_t n) {
  if (!imported_memory) return false;
  const auto* at = reinterpret_cast<const std::byte*>(from);
  const bool inside =
      at < imported_memory->base + imported_memory->size && at + n > imported_memory->base;
  return inside && (!imported_fence || last_waited.load() < imported_fence->value->load());
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
  return std::memcpy(to, reinterpret_cast<const void*>(from), n), kOk;
}
FAKE_CUDA cuMemcpyDtoHAsync_v2(void* to, cu::DevicePtr from, std::size_t n, cu::Stream) {
  if (reads_unwaited_import(from, n)) return kInvalidValue;
  return std::memcpy(to, reinterpret_cast<const void*>(from), n), kOk;
}
FAKE_CUDA cuMemcpyDtoDAsync_v2(cu::DevicePtr to, cu::DevicePtr from, std::size_t n, cu::Stream) {
  if (reads_unwaited_import(from, n)) return kInvalidValue;
  return std::memmove(reinterpret_cast<void*>(to), reinterpret_cast<const void*>(from), n), kOk;
}
FAKE_CUDA cuMemsetD8Async(cu::DevicePtr to, unsigned char value, std::size_t n, cu::Stream) {
  return std::memset(reinterpret_cast<void*>(to), value, n), kOk;
}
FAKE_CUDA cuStreamCreate(cu::Stream* s, unsigned) {
  return *s = reinterpret_cast<cu::Stream>(&dummy_object), kOk;
}
FAKE_CUDA cuStreamDestroy_v2(cu::Stream) { return kOk; }
FAKE_CUDA cuStreamSynchronize(cu::Stream) { return kOk; }
FAKE_CUDA cuStreamWaitEvent(cu::Stream, cu::Event, unsigned) { return kOk; }
FAKE_CUDA cuStreamIsCapturing(cu::Stream, int* status) { return *status = 0, kOk; }
FAKE_CUDA cuEventCreate(cu::Event* e, unsigned) {
  return *e = reinterpret_cast<cu::Event>(&dummy_object), kOk;
}
FAKE_CUDA cuEventDestroy_v2(cu::Event) { return kOk; }
FAKE_CUDA cuEventRecord(cu::Event, cu::Stream) { return kOk; }
FAKE_CUDA cuEventSynchronize(cu::Event) { return kOk; }
FAKE_CUDA cuEventQuery(cu::Event) { return kOk; }
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
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (unsigned i = 0; i < count; ++i) {
    auto* s = reinterpret_cast<ExternalSemaphore*>(semaphores[i]);
    while (s->value->load() < params[i].params.fence.value)
      if (std::chrono::steady_clock::now() > deadline)
        return kTimeout;
      else
        std::this_thread::yield();
    last_waited = std::max(last_waited.load(), params[i].params.fence.value);
  }
  return kOk;
}
FAKE_CUDA cuDestroyExternalSemaphore(cu::ExternalSemaphore) { return kOk; }
