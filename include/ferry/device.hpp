// Where tensors land: host memory ("cpu") or a CUDA device ("cuda:N").
#pragma once

#include <string>
#include <string_view>

namespace ferry {

struct Device {
  enum class Kind { Cpu, Cuda };
  Kind kind = Kind::Cpu;
  int index = 0;

  static Device cpu() { return {}; }
  static Device cuda(int index) { return {Kind::Cuda, index}; }
  // "cpu", "cuda" (= cuda:0) or "cuda:N"; throws std::invalid_argument otherwise.
  static Device parse(std::string_view text);
  std::string to_string() const;
  bool is_cuda() const noexcept { return kind == Kind::Cuda; }
  bool operator==(const Device&) const = default;
};

// True when the CUDA driver is present and reports at least one device.
bool cuda_available();

// Starts `device` now (its CUDA context), so that the first transfer does not pay for it; kept
// for the life of the process. Nothing to do for cpu. Throws CudaError where it cannot start.
void prepare_device(const Device& device);

}  // namespace ferry
