// Which D3D12 adapter is the CUDA device: the one whose LUID equals the LUID CUDA reports for it
// (cuDeviceGetLuid). On a laptop the default adapter is often the integrated GPU, and reading
// into its memory would be wrong or slow: no match is an error naming every adapter, never a
// silent fall back to the default. Pure logic, built and tested on every system.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace ferry::dstorage {

// A Windows LUID as DXGI and CUDA give it (8 bytes: low part, then high part).
struct Luid {
  std::uint32_t low = 0;
  std::int32_t high = 0;
  bool operator==(const Luid&) const = default;
};

struct AdapterInfo {
  std::string name;
  Luid luid;
  bool software = false;  // WARP and other software adapters never serve a CUDA device
};

struct AdapterChoice {
  std::optional<std::size_t> index;  // into the adapters given
  std::string reason;                // why this one, or why none
};

AdapterChoice match_adapter(const Luid& cuda_luid, std::span<const AdapterInfo> adapters);

std::string to_string(const Luid& luid);

}  // namespace ferry::dstorage
