#include "backends/dstorage/adapters.hpp"

#include "platform/windows/win32.hpp"
// windows.h first: dxgi.h needs its types.
#include <dxgi.h>

#include <cstring>

#include "shim/cuda_driver.hpp"
#include "shim/dstorage.hpp"
#include "shim/dynamic_library.hpp"

namespace ferry::dstorage {

namespace {

// DXGI's factory (a reference the caller releases), or null with `why` set.
IDXGIFactory1* dxgi_factory(std::string& why) {
  void* dxgi = shim::open_vendor_library({"dxgi.dll"}, why);
  if (!dxgi) return nullptr;
  using CreateFactory = HRESULT(WINAPI*)(REFIID, void**);
  CreateFactory create = nullptr;
  if (!shim::resolve(dxgi, "dxgi.dll", "CreateDXGIFactory1", create, why)) return nullptr;
  IDXGIFactory1* factory = nullptr;
  if (const HRESULT hr = create(__uuidof(IDXGIFactory1), reinterpret_cast<void**>(&factory));
      FAILED(hr)) {
    why = "CreateDXGIFactory1 failed (" + shim::hresult_text(hr) + ")";
    return nullptr;
  }
  return factory;
}

}  // namespace

IDXGIAdapter1* dxgi_adapter_at(std::size_t index, std::string& why) {
  IDXGIFactory1* factory = dxgi_factory(why);
  if (!factory) return nullptr;
  IDXGIAdapter1* adapter = nullptr;
  if (const HRESULT hr = factory->EnumAdapters1(static_cast<UINT>(index), &adapter); FAILED(hr)) {
    why = "IDXGIFactory1::EnumAdapters1(" + std::to_string(index) + ") failed (" +
          shim::hresult_text(hr) + ")";
    adapter = nullptr;
  }
  factory->Release();
  return adapter;
}

std::vector<AdapterInfo> dxgi_adapters(std::string& why) {
  IDXGIFactory1* factory = dxgi_factory(why);
  if (!factory) return {};
  std::vector<AdapterInfo> adapters;
  IDXGIAdapter1* adapter = nullptr;
  for (UINT i = 0; factory->EnumAdapters1(i, &adapter) != DXGI_ERROR_NOT_FOUND; ++i) {
    DXGI_ADAPTER_DESC1 desc{};
    if (adapter && SUCCEEDED(adapter->GetDesc1(&desc)))
      adapters.push_back({detail::win32::narrow(desc.Description),
                          {desc.AdapterLuid.LowPart, desc.AdapterLuid.HighPart},
                          (desc.Flags & DXGI_ADAPTER_FLAG_SOFTWARE) != 0});
    if (adapter) adapter->Release();
    adapter = nullptr;
  }
  factory->Release();
  return adapters;
}

std::optional<Luid> cuda_luid(int ordinal, std::string& why) {
  const auto& d = shim::CudaDriver::get();
  if (!d.usable) {
    why = "no usable CUDA device: " + d.why_unusable;
    return std::nullopt;
  }
  if (!d.cuDeviceGetLuid) {
    why = "the CUDA driver lacks cuDeviceGetLuid";
    return std::nullopt;
  }
  shim::cu::Device device = 0;
  char bytes[8] = {};
  unsigned int node_mask = 0;
  if (d.cuDeviceGet(&device, ordinal) != shim::cu::kSuccess ||
      d.cuDeviceGetLuid(bytes, &node_mask, device) != shim::cu::kSuccess) {
    why = "cuDeviceGetLuid failed for cuda:" + std::to_string(ordinal);
    return std::nullopt;
  }
  Luid luid;  // CUDA gives the LUID's 8 bytes as Windows lays it out: low part, then high
  std::memcpy(&luid.low, bytes, 4);
  std::memcpy(&luid.high, bytes + 4, 4);
  return luid;
}

std::string adapter_for_cuda_device(int ordinal) {
  std::string why;
  const auto luid = cuda_luid(ordinal, why);
  if (!luid) return why;
  const auto adapters = dxgi_adapters(why);
  if (adapters.empty() && !why.empty()) return why;
  return match_adapter(*luid, adapters).reason;
}

}  // namespace ferry::dstorage
