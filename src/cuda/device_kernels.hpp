// ferry's own GPU kernels (device_kernels.cu: the GPU checksum's and the matched copies'), built
// to PTX by nvcc at build time, embedded, and loaded once per device through the driver shim.
#pragma once

#include <string>

#include "shim/cuda_driver.hpp"

namespace ferry::detail {

// Why ferry's kernels cannot run on device `ordinal` in this process ("" where they can): a
// build without nvcc has none, a driver may lack the module calls or refuse the PTX.
std::string device_kernels_unavailable(int ordinal);

// The kernel `name` in device `ordinal`'s primary context; throws CudaError where they cannot
// run (device_kernels_unavailable says why).
shim::cu::Function device_kernel(int ordinal, const char* name);

}  // namespace ferry::detail
