// NCCL, opened with dlopen at run time (never linked): the collectives that fan a multi-GPU load
// out over NVLink. Only the functions ferry calls are declared, with ferry's spelling of the
// types; nccl_abi_check.cpp proves them equal to nccl.h's where that header exists.
//
// Where it is looked for: libnccl.so.2 as the dynamic loader finds it (already loaded by
// PyTorch in a Python process, or on the library path), then $FERRY_NCCL_LIBRARY, then the
// nvidia/nccl/lib folder of PyTorch's wheels in Python's usual site-packages folders.
#pragma once

#include <cstddef>
#include <string>

#include "shim/cuda_driver.hpp"

namespace ferry::shim {

namespace nccl {
using Result = int;
struct CommState;
using Comm = CommState*;
inline constexpr Result kSuccess = 0;
inline constexpr Result kInProgress = 7;
inline constexpr int kUint8 = 1;  // ncclUint8
}  // namespace nccl

// A process-wide table of NCCL's entry points, loaded once and never unloaded.
struct NcclLibrary {
  // Returns the table; never throws. Check loaded before calling through it.
  static const NcclLibrary& get();

  bool loaded = false;
  std::string why_not_loaded;
  std::string path;  // where it was found
  int version = 0;   // NCCL_VERSION_CODE: 22703 for 2.27.3

  nccl::Result (*ncclGetVersion)(int*) = nullptr;
  const char* (*ncclGetErrorString)(nccl::Result) = nullptr;
  nccl::Result (*ncclCommInitAll)(nccl::Comm*, int, const int*) = nullptr;
  nccl::Result (*ncclCommDestroy)(nccl::Comm) = nullptr;
  nccl::Result (*ncclCommAbort)(nccl::Comm) = nullptr;
  nccl::Result (*ncclCommGetAsyncError)(nccl::Comm, nccl::Result*) = nullptr;
  nccl::Result (*ncclAllGather)(const void*, void*, std::size_t, int, nccl::Comm,
                                cu::Stream) = nullptr;
  nccl::Result (*ncclGroupStart)() = nullptr;
  nccl::Result (*ncclGroupEnd)() = nullptr;
};

// "ncclUnhandledCudaError (unhandled cuda error ...)" for a result code.
std::string nccl_error_text(nccl::Result result);

// Throws CudaError naming the call and NCCL's error when result is not success.
void nccl_check(nccl::Result result, const char* call);

}  // namespace ferry::shim

// Calls an NCCL function through the table and throws CudaError on failure.
#define FERRY_NCCL(call, ...) \
  ::ferry::shim::nccl_check(::ferry::shim::NcclLibrary::get().call(__VA_ARGS__), #call)
