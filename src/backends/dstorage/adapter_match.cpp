#include "backends/dstorage/adapter_match.hpp"

#include <cstdio>

namespace ferry::dstorage {

std::string to_string(const Luid& luid) {
  char text[32];
  std::snprintf(text, sizeof text, "%08x:%08x", static_cast<unsigned>(luid.high),
                static_cast<unsigned>(luid.low));
  return text;
}

AdapterChoice match_adapter(const Luid& cuda_luid, std::span<const AdapterInfo> adapters) {
  std::string seen;
  for (std::size_t i = 0; i < adapters.size(); ++i) {
    const AdapterInfo& a = adapters[i];
    if (a.luid == cuda_luid && !a.software)
      return {i, "adapter " + std::to_string(i) + " (" + a.name + ") has the CUDA device's LUID " +
                     to_string(cuda_luid)};
    seen += (seen.empty() ? "" : ", ") + a.name + " " + to_string(a.luid) +
            (a.software ? " (software)" : "");
  }
  return {std::nullopt, "no D3D12 adapter has the CUDA device's LUID " + to_string(cuda_luid) +
                            " (adapters: " + (seen.empty() ? "none" : seen) + ")"};
}

}  // namespace ferry::dstorage
