// NVIDIA cuFile (GPUDirect Storage), opened with dlopen at run time, never linked. Only what
// ferry calls is declared, in ferry's spelling; cufile_abi_check.cpp proves the declarations
// equal cufile.h's where that header exists.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>

#include "shim/cuda_driver.hpp"

namespace ferry::shim {

namespace cufile {
// cuFile returns {cuFile status, CUDA driver result}; 0 and 0 mean success.
struct Error {
  int err;
  cu::Result cu_err;
};
inline constexpr int kSuccess = 0;
inline constexpr int kDriverNotInitialized = 5001;  // nvidia-fs absent, compat mode not allowed
inline constexpr int kHandleTypeOpaqueFd = 1;
inline constexpr int kParamAllowCompatMode = 1;   // CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE
inline constexpr int kParamForceCompatMode = 2;   // CUFILE_PARAM_FORCE_COMPAT_MODE
inline constexpr unsigned kNvmeSupportedBit = 4;  // CU_FILE_NVME_SUPPORTED in dstatusflags

struct Descriptor {
  int type;
  union {
    int fd;
    void* handle;
  } handle;
  const void* fs_ops;
};
using Handle = void*;

struct DriverProperties {
  struct {
    unsigned int major_version;
    unsigned int minor_version;
    std::size_t poll_thresh_size;
    std::size_t max_direct_io_size;
    unsigned int dstatusflags;
    unsigned int dcontrolflags;
  } nvfs;
  unsigned int fflags;
  unsigned int max_device_cache_size;
  unsigned int per_buffer_cache_size;
  unsigned int max_device_pinned_mem_size;  // KiB
  unsigned int max_batch_io_size;
  unsigned int max_batch_io_timeout_msecs;
};
}  // namespace cufile

// Loaded once, never unloaded; cuFileDriverOpen is called once, on first use of `opened`.
struct CuFileLibrary {
  static const CuFileLibrary& get();

  bool loaded = false;        // libcufile found with every symbol
  std::string why_not_loaded;

  cufile::Error (*cuFileDriverOpen)() = nullptr;
  cufile::Error (*cuFileDriverGetProperties)(cufile::DriverProperties*) = nullptr;
  cufile::Error (*cuFileGetParameterBool)(int, bool*) = nullptr;
  cufile::Error (*cuFileHandleRegister)(cufile::Handle*, cufile::Descriptor*) = nullptr;
  void (*cuFileHandleDeregister)(cufile::Handle) = nullptr;
  cufile::Error (*cuFileBufRegister)(const void*, std::size_t, int) = nullptr;
  cufile::Error (*cuFileBufDeregister)(const void*) = nullptr;
  ssize_t (*cuFileRead)(cufile::Handle, void*, std::size_t, off_t, off_t) = nullptr;
  ssize_t (*cuFileWrite)(cufile::Handle, const void*, std::size_t, off_t, off_t) = nullptr;
  cufile::Error (*cuFileGetVersion)(int*) = nullptr;
};

// "cuFile error 5001" with the CUDA result where there is one.
std::string cufile_error_text(cufile::Error error);

}  // namespace ferry::shim
