// Compiled only where the real cuda.h exists: proves at compile time that every entry point
// declared in cuda_driver.hpp has exactly cuda.h's signature once ferry's type names are mapped
// to CUDA's. A mismatch is a build error, never a corrupted call at run time.
#include <cuda.h>

#include <cstddef>
#include <type_traits>

#include "shim/cuda_driver.hpp"

namespace ferry::shim {
namespace {

template <class T>
struct Ours {
  using type = T;
};
template <class T>
struct Ours<T*> {
  using type = typename Ours<T>::type*;
};
template <class T>
struct Ours<const T> {
  using type = const typename Ours<T>::type;
};
template <class R, class... A>
struct Ours<R (*)(A...)> {
  using type = typename Ours<R>::type (*)(typename Ours<A>::type...);
};
// Enums travel as int: same size, and ferry passes only the values checked below.
template <>
struct Ours<CUdevice_attribute> {
  using type = int;
};
static_assert(sizeof(CUdevice_attribute) == sizeof(int));
template <>
struct Ours<CUstreamCaptureStatus> {
  using type = int;
};
static_assert(sizeof(CUstreamCaptureStatus) == sizeof(int));
template <>
struct Ours<CUstreamCaptureMode> {
  using type = int;
};
static_assert(sizeof(CUstreamCaptureMode) == sizeof(int));
static_assert(CU_STREAM_CAPTURE_MODE_RELAXED == cu::kStreamCaptureModeRelaxed);
template <>
struct Ours<CUresult> {
  using type = cu::Result;
};
template <>
struct Ours<CUcontext> {
  using type = cu::Context;
};
template <>
struct Ours<CUstream> {
  using type = cu::Stream;
};
template <>
struct Ours<CUevent> {
  using type = cu::Event;
};

template <>
struct Ours<CUDA_MEMCPY3D_PEER> {
  using type = cu::Memcpy3DPeer;
};

template <>
struct Ours<CUexternalMemory> {
  using type = cu::ExternalMemory;
};
template <>
struct Ours<CUexternalSemaphore> {
  using type = cu::ExternalSemaphore;
};
template <>
struct Ours<CUDA_EXTERNAL_MEMORY_HANDLE_DESC> {
  using type = cu::ExternalMemoryHandleDesc;
};
template <>
struct Ours<CUDA_EXTERNAL_MEMORY_BUFFER_DESC> {
  using type = cu::ExternalMemoryBufferDesc;
};
template <>
struct Ours<CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC> {
  using type = cu::ExternalSemaphoreHandleDesc;
};
template <>
struct Ours<CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS> {
  using type = cu::ExternalSemaphoreWaitParams;
};

template <>
struct Ours<CUmemoryPool> {
  using type = cu::MemoryPool;
};
template <>
struct Ours<CUmemPoolProps> {
  using type = cu::MemPoolProps;
};
template <>
struct Ours<CUmemPool_attribute> {
  using type = int;
};
static_assert(sizeof(CUmemPool_attribute) == sizeof(int));

template <>
struct Ours<CUmodule> {
  using type = cu::Module;
};
template <>
struct Ours<CUfunction> {
  using type = cu::Function;
};

template <class Real, class Declared>
constexpr bool same_abi = std::is_same_v<typename Ours<Real>::type, Declared>;

#define FERRY_CHECK_ABI(real, member)                                          \
  static_assert(same_abi<decltype(&::real), decltype(CudaDriver::member)>, \
                #member " in cuda_driver.hpp disagrees with " #real " in cuda.h")

static_assert(sizeof(CUresult) == sizeof(cu::Result));
static_assert(std::is_same_v<CUdevice, cu::Device>);
static_assert(std::is_same_v<CUdeviceptr, cu::DevicePtr>);
static_assert(CUDA_SUCCESS == cu::kSuccess);
static_assert(CU_MEMHOSTREGISTER_PORTABLE == cu::kMemHostRegisterPortable);
static_assert(CU_MEMHOSTREGISTER_READ_ONLY == cu::kMemHostRegisterReadOnly);
static_assert(CU_STREAM_NON_BLOCKING == cu::kStreamNonBlocking);
static_assert(CU_EVENT_DISABLE_TIMING == cu::kEventDisableTiming);
static_assert(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID == cu::kAttributePciBusId);

FERRY_CHECK_ABI(cuInit, cuInit);
FERRY_CHECK_ABI(cuDriverGetVersion, cuDriverGetVersion);
FERRY_CHECK_ABI(cuGetErrorName, cuGetErrorName);
FERRY_CHECK_ABI(cuGetErrorString, cuGetErrorString);
FERRY_CHECK_ABI(cuDeviceGetCount, cuDeviceGetCount);
FERRY_CHECK_ABI(cuDeviceGet, cuDeviceGet);
FERRY_CHECK_ABI(cuDeviceGetName, cuDeviceGetName);
FERRY_CHECK_ABI(cuDeviceGetAttribute, cuDeviceGetAttribute);
FERRY_CHECK_ABI(cuDeviceGetLuid, cuDeviceGetLuid);
FERRY_CHECK_ABI(cuDeviceTotalMem_v2, cuDeviceTotalMem);
FERRY_CHECK_ABI(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain);
FERRY_CHECK_ABI(cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease);
FERRY_CHECK_ABI(cuCtxSetCurrent, cuCtxSetCurrent);
FERRY_CHECK_ABI(cuMemGetInfo_v2, cuMemGetInfo);
FERRY_CHECK_ABI(cuMemAlloc_v2, cuMemAlloc);
FERRY_CHECK_ABI(cuMemFree_v2, cuMemFree);
FERRY_CHECK_ABI(cuMemHostRegister_v2, cuMemHostRegister);
FERRY_CHECK_ABI(cuMemHostUnregister, cuMemHostUnregister);
FERRY_CHECK_ABI(cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync);
FERRY_CHECK_ABI(cuMemcpyDtoH_v2, cuMemcpyDtoH);
FERRY_CHECK_ABI(cuStreamCreate, cuStreamCreate);
FERRY_CHECK_ABI(cuStreamDestroy_v2, cuStreamDestroy);
FERRY_CHECK_ABI(cuStreamSynchronize, cuStreamSynchronize);
FERRY_CHECK_ABI(cuStreamWaitEvent, cuStreamWaitEvent);
FERRY_CHECK_ABI(cuStreamIsCapturing, cuStreamIsCapturing);
FERRY_CHECK_ABI(cuEventQuery, cuEventQuery);
FERRY_CHECK_ABI(cuThreadExchangeStreamCaptureMode, cuThreadExchangeStreamCaptureMode);
FERRY_CHECK_ABI(cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync);
FERRY_CHECK_ABI(cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync);
FERRY_CHECK_ABI(cuMemsetD8Async, cuMemsetD8Async);
FERRY_CHECK_ABI(cuEventCreate, cuEventCreate);
FERRY_CHECK_ABI(cuEventDestroy_v2, cuEventDestroy);
FERRY_CHECK_ABI(cuEventRecord, cuEventRecord);
FERRY_CHECK_ABI(cuEventSynchronize, cuEventSynchronize);
FERRY_CHECK_ABI(cuEventElapsedTime, cuEventElapsedTime);
FERRY_CHECK_ABI(cuCtxEnablePeerAccess, cuCtxEnablePeerAccess);
FERRY_CHECK_ABI(cuMemcpy3DPeerAsync, cuMemcpy3DPeerAsync);
static_assert(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED == cu::kErrorPeerAccessAlreadyEnabled);
static_assert(CU_MEMORYTYPE_DEVICE == cu::kMemoryTypeDevice);
static_assert(sizeof(CUmemorytype) == sizeof(unsigned));
// The struct field by field: same size and every offset equal.
static_assert(sizeof(CUDA_MEMCPY3D_PEER) == sizeof(cu::Memcpy3DPeer));
#define FERRY_CHECK_FIELD(f) \
  static_assert(offsetof(CUDA_MEMCPY3D_PEER, f) == offsetof(cu::Memcpy3DPeer, f), #f)
FERRY_CHECK_FIELD(srcXInBytes);
FERRY_CHECK_FIELD(srcMemoryType);
FERRY_CHECK_FIELD(srcHost);
FERRY_CHECK_FIELD(srcDevice);
FERRY_CHECK_FIELD(srcArray);
FERRY_CHECK_FIELD(srcContext);
FERRY_CHECK_FIELD(srcPitch);
FERRY_CHECK_FIELD(srcHeight);
FERRY_CHECK_FIELD(dstXInBytes);
FERRY_CHECK_FIELD(dstMemoryType);
FERRY_CHECK_FIELD(dstHost);
FERRY_CHECK_FIELD(dstDevice);
FERRY_CHECK_FIELD(dstArray);
FERRY_CHECK_FIELD(dstContext);
FERRY_CHECK_FIELD(dstPitch);
FERRY_CHECK_FIELD(dstHeight);
FERRY_CHECK_FIELD(WidthInBytes);
FERRY_CHECK_FIELD(Height);
FERRY_CHECK_FIELD(Depth);  // cuda.h maps it to the current version
static_assert(CU_EVENT_DEFAULT == cu::kEventDefault);

// External memory and semaphores: the entry points, the constants and every field's offset.
FERRY_CHECK_ABI(cuImportExternalMemory, cuImportExternalMemory);
FERRY_CHECK_ABI(cuExternalMemoryGetMappedBuffer, cuExternalMemoryGetMappedBuffer);
FERRY_CHECK_ABI(cuDestroyExternalMemory, cuDestroyExternalMemory);
FERRY_CHECK_ABI(cuImportExternalSemaphore, cuImportExternalSemaphore);
FERRY_CHECK_ABI(cuWaitExternalSemaphoresAsync, cuWaitExternalSemaphoresAsync);
FERRY_CHECK_ABI(cuDestroyExternalSemaphore, cuDestroyExternalSemaphore);
static_assert(CU_EXTERNAL_MEMORY_HANDLE_TYPE_D3D12_RESOURCE ==
              cu::kExternalMemoryHandleTypeD3D12Resource);
static_assert(CUDA_EXTERNAL_MEMORY_DEDICATED == cu::kExternalMemoryDedicated);
static_assert(CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_D3D12_FENCE ==
              cu::kExternalSemaphoreHandleTypeD3D12Fence);
#define FERRY_CHECK_STRUCT_FIELD(real, ours, f) \
  static_assert(offsetof(real, f) == offsetof(ours, f), #real "." #f)
static_assert(sizeof(CUDA_EXTERNAL_MEMORY_HANDLE_DESC) == sizeof(cu::ExternalMemoryHandleDesc));
FERRY_CHECK_STRUCT_FIELD(CUDA_EXTERNAL_MEMORY_HANDLE_DESC, cu::ExternalMemoryHandleDesc, type);
FERRY_CHECK_STRUCT_FIELD(CUDA_EXTERNAL_MEMORY_HANDLE_DESC, cu::ExternalMemoryHandleDesc,
                         handle.win32.handle);
FERRY_CHECK_STRUCT_FIELD(CUDA_EXTERNAL_MEMORY_HANDLE_DESC, cu::ExternalMemoryHandleDesc, size);
FERRY_CHECK_STRUCT_FIELD(CUDA_EXTERNAL_MEMORY_HANDLE_DESC, cu::ExternalMemoryHandleDesc, flags);
static_assert(sizeof(CUDA_EXTERNAL_MEMORY_BUFFER_DESC) == sizeof(cu::ExternalMemoryBufferDesc));
FERRY_CHECK_STRUCT_FIELD(CUDA_EXTERNAL_MEMORY_BUFFER_DESC, cu::ExternalMemoryBufferDesc, offset);
FERRY_CHECK_STRUCT_FIELD(CUDA_EXTERNAL_MEMORY_BUFFER_DESC, cu::ExternalMemoryBufferDesc, size);
FERRY_CHECK_STRUCT_FIELD(CUDA_EXTERNAL_MEMORY_BUFFER_DESC, cu::ExternalMemoryBufferDesc, flags);
static_assert(sizeof(CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC) ==
              sizeof(cu::ExternalSemaphoreHandleDesc));
FERRY_CHECK_STRUCT_FIELD(CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC, cu::ExternalSemaphoreHandleDesc,
                         handle.win32.handle);
FERRY_CHECK_STRUCT_FIELD(CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC, cu::ExternalSemaphoreHandleDesc,
                         flags);
static_assert(sizeof(CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS) ==
              sizeof(cu::ExternalSemaphoreWaitParams));
FERRY_CHECK_STRUCT_FIELD(CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS, cu::ExternalSemaphoreWaitParams,
                         params.fence.value);
FERRY_CHECK_STRUCT_FIELD(CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS, cu::ExternalSemaphoreWaitParams,
                         flags);

// Stream-ordered memory pools (the device memory cache).
FERRY_CHECK_ABI(cuMemPoolCreate, cuMemPoolCreate);
FERRY_CHECK_ABI(cuMemPoolSetAttribute, cuMemPoolSetAttribute);
FERRY_CHECK_ABI(cuMemPoolGetAttribute, cuMemPoolGetAttribute);
FERRY_CHECK_ABI(cuMemPoolTrimTo, cuMemPoolTrimTo);
FERRY_CHECK_ABI(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync);
FERRY_CHECK_ABI(cuMemFreeAsync, cuMemFreeAsync);
FERRY_CHECK_ABI(cuCtxSynchronize, cuCtxSynchronize);
FERRY_CHECK_ABI(cuModuleLoadData, cuModuleLoadData);
FERRY_CHECK_ABI(cuModuleGetFunction, cuModuleGetFunction);
FERRY_CHECK_ABI(cuLaunchKernel, cuLaunchKernel);
static_assert(CU_MEM_ALLOCATION_TYPE_PINNED == cu::kMemAllocationTypePinned);
static_assert(CU_MEM_LOCATION_TYPE_DEVICE == cu::kMemLocationTypeDevice);
static_assert(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD == cu::kMemPoolAttrReleaseThreshold);
static_assert(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT == cu::kMemPoolAttrReservedMemCurrent);
static_assert(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED == cu::kAttributeMemoryPoolsSupported);
static_assert(sizeof(CUmemPoolProps) == sizeof(cu::MemPoolProps));
FERRY_CHECK_STRUCT_FIELD(CUmemPoolProps, cu::MemPoolProps, allocType);
FERRY_CHECK_STRUCT_FIELD(CUmemPoolProps, cu::MemPoolProps, handleTypes);
FERRY_CHECK_STRUCT_FIELD(CUmemPoolProps, cu::MemPoolProps, location.type);
FERRY_CHECK_STRUCT_FIELD(CUmemPoolProps, cu::MemPoolProps, location.id);
FERRY_CHECK_STRUCT_FIELD(CUmemPoolProps, cu::MemPoolProps, win32SecurityAttributes);
FERRY_CHECK_STRUCT_FIELD(CUmemPoolProps, cu::MemPoolProps, maxSize);
FERRY_CHECK_STRUCT_FIELD(CUmemPoolProps, cu::MemPoolProps, usage);

}  // namespace
}  // namespace ferry::shim
