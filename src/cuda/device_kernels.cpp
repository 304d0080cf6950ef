#include "cuda/device_kernels.hpp"

#include <map>
#include <mutex>

#include "cuda/cuda_resources.hpp"
#include "ferry/error.hpp"

namespace ferry::detail {

#ifdef FERRY_DEVICE_KERNELS_PTX
extern const char kDeviceKernelsPtx[];  // device_kernels.cu built by nvcc (the generated file)
#endif

namespace {

struct Loaded {
  shim::cu::Module module = nullptr;
  std::string why_not;  // set where the kernels cannot run
};

std::string why_no_kernels() {
#ifdef FERRY_DEVICE_KERNELS_PTX
  const auto& d = shim::CudaDriver::get();
  if (!d.usable) return d.why_unusable;
  if (!d.cuModuleLoadData || !d.cuModuleGetFunction || !d.cuLaunchKernel)
    return "the CUDA driver lacks cuModuleLoadData, cuModuleGetFunction or cuLaunchKernel";
  return "";
#else
  return "this build of ferry has no GPU kernels (nvcc was not found when it was built)";
#endif
}

// The module, loaded once per device into its primary context (never unloaded: it lives as long
// as the process, like the driver).
const Loaded& module(int ordinal) {
  static std::mutex mutex;
  static auto* loaded = new std::map<int, Loaded>;
  std::lock_guard lock(mutex);
  if (auto it = loaded->find(ordinal); it != loaded->end()) return it->second;
  Loaded& l = (*loaded)[ordinal];
  l.why_not = why_no_kernels();
#ifdef FERRY_DEVICE_KERNELS_PTX
  if (l.why_not.empty()) {
    try {
      device_context(ordinal).make_current();
      FERRY_CU(cuModuleLoadData, &l.module, kDeviceKernelsPtx);
    } catch (const std::exception& e) {
      l.module = nullptr;
      l.why_not = std::string("loading ferry's GPU kernels: ") + e.what();
    }
  }
#endif
  return l;
}

}  // namespace

std::string device_kernels_unavailable(int ordinal) { return module(ordinal).why_not; }

shim::cu::Function device_kernel(int ordinal, const char* name) {
  const Loaded& l = module(ordinal);
  FERRY_EXPECT(l.why_not.empty(), CudaError, "ferry's GPU kernels cannot run on cuda:", ordinal,
               ": ", l.why_not);
  shim::cu::Function f = nullptr;
  FERRY_CU(cuModuleGetFunction, &f, l.module, name);
  return f;
}

}  // namespace ferry::detail
