#include "shim/cuda_driver.hpp"

#include "ferry/error.hpp"
#include "shim/dynamic_library.hpp"

namespace ferry::shim {
namespace {

#ifdef _WIN32
constexpr const char* kLibrary = "nvcuda.dll";
#else
constexpr const char* kLibrary = "libcuda.so.1";
#endif

template <class Fn>
bool resolve(void* library, const char* symbol, Fn& slot, std::string& why) {
  return shim::resolve(library, kLibrary, symbol, slot, why);
}

CudaDriver load_driver() {
  CudaDriver d;
  void* library = open_vendor_library({kLibrary}, d.why_unusable);
  if (library == nullptr) {
    d.why_unusable = "the CUDA driver library " + d.why_unusable;
    return d;
  }
  std::string& why = d.why_unusable;
  bool ok = resolve(library, "cuInit", d.cuInit, why);
  ok &= resolve(library, "cuDriverGetVersion", d.cuDriverGetVersion, why);
  ok &= resolve(library, "cuGetErrorName", d.cuGetErrorName, why);
  ok &= resolve(library, "cuGetErrorString", d.cuGetErrorString, why);
  ok &= resolve(library, "cuDeviceGetCount", d.cuDeviceGetCount, why);
  ok &= resolve(library, "cuDeviceGet", d.cuDeviceGet, why);
  ok &= resolve(library, "cuDeviceGetName", d.cuDeviceGetName, why);
  ok &= resolve(library, "cuDeviceGetAttribute", d.cuDeviceGetAttribute, why);
  ok &= resolve(library, "cuDeviceTotalMem_v2", d.cuDeviceTotalMem, why);
  ok &= resolve(library, "cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain, why);
  ok &= resolve(library, "cuDevicePrimaryCtxRelease_v2", d.cuDevicePrimaryCtxRelease, why);
  ok &= resolve(library, "cuCtxSetCurrent", d.cuCtxSetCurrent, why);
  ok &= resolve(library, "cuMemGetInfo_v2", d.cuMemGetInfo, why);
  ok &= resolve(library, "cuMemAlloc_v2", d.cuMemAlloc, why);
  ok &= resolve(library, "cuMemFree_v2", d.cuMemFree, why);
  ok &= resolve(library, "cuMemHostRegister_v2", d.cuMemHostRegister, why);
  ok &= resolve(library, "cuMemHostUnregister", d.cuMemHostUnregister, why);
  ok &= resolve(library, "cuMemcpyHtoDAsync_v2", d.cuMemcpyHtoDAsync, why);
  ok &= resolve(library, "cuMemcpyDtoH_v2", d.cuMemcpyDtoH, why);
  ok &= resolve(library, "cuMemcpyDtoHAsync_v2", d.cuMemcpyDtoHAsync, why);
  ok &= resolve(library, "cuMemcpyDtoDAsync_v2", d.cuMemcpyDtoDAsync, why);
  ok &= resolve(library, "cuMemsetD8Async", d.cuMemsetD8Async, why);
  ok &= resolve(library, "cuStreamCreate", d.cuStreamCreate, why);
  ok &= resolve(library, "cuStreamDestroy_v2", d.cuStreamDestroy, why);
  ok &= resolve(library, "cuStreamSynchronize", d.cuStreamSynchronize, why);
  ok &= resolve(library, "cuStreamWaitEvent", d.cuStreamWaitEvent, why);
  ok &= resolve(library, "cuStreamIsCapturing", d.cuStreamIsCapturing, why);
  ok &= resolve(library, "cuEventCreate", d.cuEventCreate, why);
  ok &= resolve(library, "cuEventDestroy_v2", d.cuEventDestroy, why);
  ok &= resolve(library, "cuEventRecord", d.cuEventRecord, why);
  ok &= resolve(library, "cuEventSynchronize", d.cuEventSynchronize, why);
  ok &= resolve(library, "cuEventQuery", d.cuEventQuery, why);
  ok &= resolve(library, "cuCtxEnablePeerAccess", d.cuCtxEnablePeerAccess, why);
  ok &= resolve(library, "cuMemcpy3DPeerAsync", d.cuMemcpy3DPeerAsync, why);
  if (!ok) return d;
  d.cuDeviceGetLuid =
      reinterpret_cast<decltype(d.cuDeviceGetLuid)>(find_symbol(library, "cuDeviceGetLuid"));
  std::string optional;
  if (!resolve(library, "cuEventElapsedTime_v2", d.cuEventElapsedTime, optional))
    resolve(library, "cuEventElapsedTime", d.cuEventElapsedTime, optional);
  resolve(library, "cuThreadExchangeStreamCaptureMode", d.cuThreadExchangeStreamCaptureMode,
          optional);
  resolve(library, "cuImportExternalMemory", d.cuImportExternalMemory, optional);
  resolve(library, "cuExternalMemoryGetMappedBuffer", d.cuExternalMemoryGetMappedBuffer, optional);
  resolve(library, "cuDestroyExternalMemory", d.cuDestroyExternalMemory, optional);
  resolve(library, "cuImportExternalSemaphore", d.cuImportExternalSemaphore, optional);
  resolve(library, "cuWaitExternalSemaphoresAsync", d.cuWaitExternalSemaphoresAsync, optional);
  resolve(library, "cuDestroyExternalSemaphore", d.cuDestroyExternalSemaphore, optional);
  resolve(library, "cuMemPoolCreate", d.cuMemPoolCreate, optional);
  resolve(library, "cuMemPoolSetAttribute", d.cuMemPoolSetAttribute, optional);
  resolve(library, "cuMemPoolGetAttribute", d.cuMemPoolGetAttribute, optional);
  resolve(library, "cuMemPoolTrimTo", d.cuMemPoolTrimTo, optional);
  resolve(library, "cuMemAllocFromPoolAsync", d.cuMemAllocFromPoolAsync, optional);
  resolve(library, "cuMemFreeAsync", d.cuMemFreeAsync, optional);
  resolve(library, "cuCtxSynchronize", d.cuCtxSynchronize, optional);
  resolve(library, "cuModuleLoadData", d.cuModuleLoadData, optional);
  resolve(library, "cuModuleGetFunction", d.cuModuleGetFunction, optional);
  resolve(library, "cuLaunchKernel", d.cuLaunchKernel, optional);

  if (cu::Result r = d.cuInit(0); r != cu::kSuccess) {
    const char* name = nullptr;
    d.cuGetErrorName(r, &name);
    d.why_unusable = std::string("cuInit failed: ") + (name ? name : std::to_string(r)) +
                     " (no usable GPU or driver)";
    return d;
  }
  d.cuDriverGetVersion(&d.driver_version);
  d.cuDeviceGetCount(&d.device_count);
  if (d.device_count <= 0) {
    d.why_unusable = "the CUDA driver reports no devices";
    return d;
  }
  d.usable = true;
  return d;
}

}  // namespace

const CudaDriver& CudaDriver::get() {
  static const CudaDriver driver = load_driver();
  return driver;
}

std::string cuda_error_text(cu::Result result) {
  const auto& d = CudaDriver::get();
  const char* name = nullptr;
  const char* text = nullptr;
  if (d.cuGetErrorName) d.cuGetErrorName(result, &name);
  if (d.cuGetErrorString) d.cuGetErrorString(result, &text);
  return std::string(name ? name : "CUDA error " + std::to_string(result)) + " (" +
         (text ? text : "no description") + ")";
}

void cuda_check(cu::Result result, const char* call) {
  if (result != cu::kSuccess) [[unlikely]]
    detail::fail<CudaError>(call, " failed: ", cuda_error_text(result));
}

}  // namespace ferry::shim
