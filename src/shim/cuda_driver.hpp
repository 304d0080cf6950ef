// The CUDA driver API, opened with dlopen at run time: ferry builds without a CUDA toolkit and
// runs without a GPU. Only the functions ferry calls are declared, with ferry's own spelling of
// the types; cuda_driver_abi_check.cpp proves them equal to cuda.h's where that header exists.
#pragma once

#include <cstddef>
#include <string>

namespace ferry::shim {

namespace cu {
using Result = int;
using Device = int;
using DevicePtr = unsigned long long;
struct ContextState;
using Context = ContextState*;
struct StreamState;
using Stream = StreamState*;
struct EventState;
using Event = EventState*;
struct ModuleState;
using Module = ModuleState*;
struct FunctionState;
using Function = FunctionState*;

inline constexpr Result kSuccess = 0;
inline constexpr unsigned kMemHostRegisterPortable = 0x01;
// The device only reads the range: what lets the driver pin a read-only file mapping (the page
// cache's pages) for page-cache DMA.
inline constexpr unsigned kMemHostRegisterReadOnly = 0x08;
inline constexpr unsigned kStreamNonBlocking = 0x1;
inline constexpr unsigned kEventDefault = 0x0;
inline constexpr unsigned kEventDisableTiming = 0x2;
inline constexpr int kAttributePciBusId = 33;
inline constexpr Result kErrorPeerAccessAlreadyEnabled = 704;
inline constexpr unsigned kMemoryTypeDevice = 0x02;
inline constexpr int kStreamCaptureModeRelaxed = 2;
// Stream-ordered memory pools (CUDA 11.2 and later): ferry's opt-in device memory cache.
struct MemoryPoolState;
using MemoryPool = MemoryPoolState*;
inline constexpr int kMemAllocationTypePinned = 0x1;
inline constexpr int kMemLocationTypeDevice = 0x1;
inline constexpr int kMemPoolAttrReleaseThreshold = 4;  // cuuint64_t
inline constexpr int kMemPoolAttrReservedMemCurrent = 5;
inline constexpr int kAttributeMemoryPoolsSupported = 115;
struct MemPoolProps {  // CUmemPoolProps (v1): zero it ({}) before use, as cuda.h asks
  int allocType = 0;
  int handleTypes = 0;
  struct {
    int type = 0;
    int id = 0;
  } location;
  void* win32SecurityAttributes = nullptr;
  std::size_t maxSize = 0;
  unsigned short usage = 0;
  unsigned char reserved[54] = {};
};
static_assert(sizeof(MemPoolProps) == 88);
struct ArrayState;
// CUDA_MEMCPY3D_PEER: a strided copy between (or within) devices' memory.
struct Memcpy3DPeer {
  std::size_t srcXInBytes = 0, srcY = 0, srcZ = 0, srcLOD = 0;
  unsigned srcMemoryType = 0;
  const void* srcHost = nullptr;
  DevicePtr srcDevice = 0;
  ArrayState* srcArray = nullptr;
  Context srcContext = nullptr;
  std::size_t srcPitch = 0, srcHeight = 0;
  std::size_t dstXInBytes = 0, dstY = 0, dstZ = 0, dstLOD = 0;
  unsigned dstMemoryType = 0;
  void* dstHost = nullptr;
  DevicePtr dstDevice = 0;
  ArrayState* dstArray = nullptr;
  Context dstContext = nullptr;
  std::size_t dstPitch = 0, dstHeight = 0;
  std::size_t WidthInBytes = 0, Height = 0, Depth = 0;
};

// External memory and semaphores (CUDA 10 and later): what DirectStorage's D3D12 buffer and
// fence become in CUDA on Windows (transfer/dstorage_gpu.cpp). The v1 structs of cuda.h, byte
// for byte; zero them ({}) before use, as cuda.h asks of `reserved`.
struct ExternalMemoryState;
using ExternalMemory = ExternalMemoryState*;
struct ExternalSemaphoreState;
using ExternalSemaphore = ExternalSemaphoreState*;
inline constexpr int kExternalMemoryHandleTypeD3D12Resource = 5;
inline constexpr unsigned kExternalMemoryDedicated = 0x1;
inline constexpr int kExternalSemaphoreHandleTypeD3D12Fence = 4;
union ExternalHandle {
  int fd;
  struct {
    void* handle;  // an NT handle (CreateSharedHandle); CUDA does not take ownership of it
    const void* name;
  } win32;
  const void* nvSciObject;
};
struct ExternalMemoryHandleDesc {  // CUDA_EXTERNAL_MEMORY_HANDLE_DESC
  int type;
  ExternalHandle handle;
  unsigned long long size;  // for a D3D12 resource: GetResourceAllocationInfo's SizeInBytes
  unsigned flags;
  unsigned reserved[16];
};
struct ExternalMemoryBufferDesc {  // CUDA_EXTERNAL_MEMORY_BUFFER_DESC
  unsigned long long offset;
  unsigned long long size;
  unsigned flags;
  unsigned reserved[16];
};
struct ExternalSemaphoreHandleDesc {  // CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC
  int type;
  ExternalHandle handle;
  unsigned flags;
  unsigned reserved[16];
};
struct ExternalSemaphoreWaitParams {  // CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS
  struct {
    struct {
      unsigned long long value;  // the fence value to wait for
    } fence;
    union {
      void* fence;
      unsigned long long reserved;
    } nvSciSync;
    struct {
      unsigned long long key;
      unsigned timeoutMs;
    } keyedMutex;
    unsigned reserved[10];
  } params;
  unsigned flags;
  unsigned reserved[16];
};
static_assert(sizeof(ExternalMemoryHandleDesc) == 104 && sizeof(ExternalMemoryBufferDesc) == 88 &&
              sizeof(ExternalSemaphoreHandleDesc) == 96 &&
              sizeof(ExternalSemaphoreWaitParams) == 144);
}  // namespace cu

// A process-wide table of driver entry points. Loaded once, never unloaded (the library is
// opened with RTLD_NODELETE): CUDA must never be torn down from a static destructor.
struct CudaDriver {
  // Returns the table; never throws. Check usable() before calling through it.
  static const CudaDriver& get();

  // Step one: libcuda.so.1 opened and every symbol found. Step two: cuInit succeeded and at
  // least one device exists. Either failure is described by `why_unusable`.
  bool usable = false;
  std::string why_unusable;
  int driver_version = 0;
  int device_count = 0;

  cu::Result (*cuInit)(unsigned) = nullptr;
  cu::Result (*cuDriverGetVersion)(int*) = nullptr;
  cu::Result (*cuGetErrorName)(cu::Result, const char**) = nullptr;
  cu::Result (*cuGetErrorString)(cu::Result, const char**) = nullptr;
  cu::Result (*cuDeviceGetCount)(int*) = nullptr;
  cu::Result (*cuDeviceGet)(cu::Device*, int) = nullptr;
  cu::Result (*cuDeviceGetName)(char*, int, cu::Device) = nullptr;
  cu::Result (*cuDeviceGetAttribute)(int*, int, cu::Device) = nullptr;
  // Optional (null where the driver lacks it): the device's adapter LUID, meaningful on Windows,
  // where DirectStorage must use the D3D12 adapter of the same GPU.
  cu::Result (*cuDeviceGetLuid)(char*, unsigned int*, cu::Device) = nullptr;
  cu::Result (*cuDeviceTotalMem)(std::size_t*, cu::Device) = nullptr;
  cu::Result (*cuDevicePrimaryCtxRetain)(cu::Context*, cu::Device) = nullptr;
  cu::Result (*cuDevicePrimaryCtxRelease)(cu::Device) = nullptr;
  cu::Result (*cuCtxSetCurrent)(cu::Context) = nullptr;
  cu::Result (*cuMemGetInfo)(std::size_t*, std::size_t*) = nullptr;
  cu::Result (*cuMemAlloc)(cu::DevicePtr*, std::size_t) = nullptr;
  cu::Result (*cuMemFree)(cu::DevicePtr) = nullptr;
  cu::Result (*cuMemHostRegister)(void*, std::size_t, unsigned) = nullptr;
  cu::Result (*cuMemHostUnregister)(void*) = nullptr;
  cu::Result (*cuMemcpyHtoDAsync)(cu::DevicePtr, const void*, std::size_t, cu::Stream) = nullptr;
  cu::Result (*cuMemcpyDtoH)(void*, cu::DevicePtr, std::size_t) = nullptr;
  cu::Result (*cuMemcpyDtoHAsync)(void*, cu::DevicePtr, std::size_t, cu::Stream) = nullptr;
  cu::Result (*cuMemcpyDtoDAsync)(cu::DevicePtr, cu::DevicePtr, std::size_t, cu::Stream) = nullptr;
  cu::Result (*cuMemsetD8Async)(cu::DevicePtr, unsigned char, std::size_t, cu::Stream) = nullptr;
  cu::Result (*cuStreamCreate)(cu::Stream*, unsigned) = nullptr;
  cu::Result (*cuStreamDestroy)(cu::Stream) = nullptr;
  cu::Result (*cuStreamSynchronize)(cu::Stream) = nullptr;
  cu::Result (*cuStreamWaitEvent)(cu::Stream, cu::Event, unsigned) = nullptr;
  // status: 0 none, 1 active, 2 invalidated (CUstreamCaptureStatus)
  cu::Result (*cuStreamIsCapturing)(cu::Stream, int*) = nullptr;
  cu::Result (*cuEventCreate)(cu::Event*, unsigned) = nullptr;
  cu::Result (*cuEventDestroy)(cu::Event) = nullptr;
  cu::Result (*cuEventRecord)(cu::Event, cu::Stream) = nullptr;
  cu::Result (*cuEventSynchronize)(cu::Event) = nullptr;
  cu::Result (*cuEventQuery)(cu::Event) = nullptr;
  cu::Result (*cuCtxEnablePeerAccess)(cu::Context, unsigned) = nullptr;
  cu::Result (*cuMemcpy3DPeerAsync)(const cu::Memcpy3DPeer*, cu::Stream) = nullptr;
  // Optional (null where the driver lacks it): timing only, never needed to move bytes.
  cu::Result (*cuEventElapsedTime)(float*, cu::Event, cu::Event) = nullptr;
  // Optional: the calling thread's stream-capture interaction mode (CUstreamCaptureMode), swapped.
  cu::Result (*cuThreadExchangeStreamCaptureMode)(int*) = nullptr;
  // Optional (null where the driver lacks them): external memory and semaphores, for
  // DirectStorage's D3D12 buffer and fence. cuExternalMemoryGetMappedBuffer's pointer is freed
  // with cuMemFree.
  cu::Result (*cuImportExternalMemory)(cu::ExternalMemory*,
                                       const cu::ExternalMemoryHandleDesc*) = nullptr;
  cu::Result (*cuExternalMemoryGetMappedBuffer)(cu::DevicePtr*, cu::ExternalMemory,
                                                const cu::ExternalMemoryBufferDesc*) = nullptr;
  cu::Result (*cuDestroyExternalMemory)(cu::ExternalMemory) = nullptr;
  cu::Result (*cuImportExternalSemaphore)(cu::ExternalSemaphore*,
                                          const cu::ExternalSemaphoreHandleDesc*) = nullptr;
  cu::Result (*cuWaitExternalSemaphoresAsync)(const cu::ExternalSemaphore*,
                                              const cu::ExternalSemaphoreWaitParams*, unsigned,
                                              cu::Stream) = nullptr;
  cu::Result (*cuDestroyExternalSemaphore)(cu::ExternalSemaphore) = nullptr;
  // Optional (null where the driver lacks them, before CUDA 11.2): stream-ordered memory pools,
  // for the opt-in device memory cache (cuda/device_memory_cache.hpp).
  cu::Result (*cuMemPoolCreate)(cu::MemoryPool*, const cu::MemPoolProps*) = nullptr;
  cu::Result (*cuMemPoolSetAttribute)(cu::MemoryPool, int, void*) = nullptr;
  cu::Result (*cuMemPoolGetAttribute)(cu::MemoryPool, int, void*) = nullptr;
  cu::Result (*cuMemPoolTrimTo)(cu::MemoryPool, std::size_t) = nullptr;
  cu::Result (*cuMemAllocFromPoolAsync)(cu::DevicePtr*, std::size_t, cu::MemoryPool,
                                        cu::Stream) = nullptr;
  cu::Result (*cuMemFreeAsync)(cu::DevicePtr, cu::Stream) = nullptr;
  cu::Result (*cuCtxSynchronize)() = nullptr;
  // Optional (null where missing; every driver has them): ferry's one kernel, the GPU checksum
  // of KV blocks (cuda/gpu_checksum.hpp), loaded from embedded PTX.
  cu::Result (*cuModuleLoadData)(cu::Module*, const void*) = nullptr;
  cu::Result (*cuModuleGetFunction)(cu::Function*, cu::Module, const char*) = nullptr;
  cu::Result (*cuLaunchKernel)(cu::Function, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, cu::Stream, void**, void**) = nullptr;
};

// "CUDA_ERROR_OUT_OF_MEMORY (out of memory)" for a result code.
std::string cuda_error_text(cu::Result result);

// Throws CudaError naming the call and the driver's error when result is not success.
void cuda_check(cu::Result result, const char* call);

}  // namespace ferry::shim

// Calls a driver function through the table and throws CudaError on failure.
#define FERRY_CU(call, ...) \
  ::ferry::shim::cuda_check(::ferry::shim::CudaDriver::get().call(__VA_ARGS__), #call)
