// The D3D12-capable adapters DXGI lists (dxgi.dll, loaded at run time) and the CUDA device's
// LUID, for matching them (adapter_match.hpp). Windows only.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "backends/dstorage/adapter_match.hpp"

struct IDXGIAdapter1;

namespace ferry::dstorage {

// Every adapter DXGI enumerates, or an empty list with `why` saying what failed.
std::vector<AdapterInfo> dxgi_adapters(std::string& why);

// The adapter dxgi_adapters() listed at `index` (a reference the caller releases), or null with
// `why` set.
IDXGIAdapter1* dxgi_adapter_at(std::size_t index, std::string& why);

// cuda:`ordinal`'s LUID, or nothing with `why` set (no driver, no device, no cuDeviceGetLuid).
std::optional<Luid> cuda_luid(int ordinal, std::string& why);

// Which adapter is cuda:`ordinal`, in words (the match or why there is none).
std::string adapter_for_cuda_device(int ordinal);

}  // namespace ferry::dstorage
