// The D3D12 -> CUDA bridge of the DirectStorage backend (backends/dstorage/dstorage_bridge.hpp), made step
// by step; a step that fails is named in the error with the system's own words, and what the
// steps before it made is released. d3d12.dll (shim/d3d12.hpp) and dxgi.dll are loaded at run
// time, as dstorage.dll and nvcuda.dll are: nothing is linked.
#include "backends/dstorage/dstorage_bridge.hpp"

#include "shim/d3d12.hpp"
// d3d12.h (through the shim) before dxgi.h.
#include <dxgi.h>

#include <map>
#include <memory>

#include "cuda/cuda_resources.hpp"
#include "backends/dstorage/adapters.hpp"
#include "shim/dstorage.hpp"

namespace ferry::detail {
namespace {

namespace cu = shim::cu;

struct ReleaseCom {
  void operator()(IUnknown* p) const noexcept {
    if (p) p->Release();
  }
};
template <class T>
using Com = std::unique_ptr<T, ReleaseCom>;

// What each step needs in words: "step 4 of 11 (D3D12CreateDevice on ...) failed: why".
class Steps {
 public:
  explicit Steps(int ordinal) : _ordinal(ordinal) {}
  void next(std::string what) {
    ++_step;
    _what = std::move(what);
  }
  std::string failed(const std::string& why) const {
    return "DirectStorage to cuda:" + std::to_string(_ordinal) + " needs a D3D12 buffer shared " +
           "with CUDA; step " + std::to_string(_step) + " of " + std::to_string(kSteps) + " (" +
           _what + ") failed: " + why;
  }
  static constexpr int kSteps = 11;

 private:
  int _ordinal;
  int _step = 0;
  std::string _what;
};

std::string cuda_failure(cu::Result r) { return shim::cuda_error_text(r); }

// The whole construction; returns the bridge or sets `error`.
std::unique_ptr<DirectStorageBridge> build(int ordinal, std::string& error) {
  Steps steps(ordinal);
  auto bridge = std::make_unique<DirectStorageBridge>();
  bridge->ordinal = ordinal;
  const auto& d = shim::CudaDriver::get();
  const auto fail = [&](const std::string& why) {
    error = steps.failed(why);
    return std::unique_ptr<DirectStorageBridge>();
  };

  steps.next("the CUDA device's LUID, cuDeviceGetLuid");
  std::string why;
  const auto luid = dstorage::cuda_luid(ordinal, why);
  if (!luid) return fail(why);
  if (!d.cuImportExternalMemory || !d.cuExternalMemoryGetMappedBuffer ||
      !d.cuImportExternalSemaphore || !d.cuWaitExternalSemaphoresAsync)
    return fail(
        "the CUDA driver lacks the external memory and semaphore functions "
        "(cuImportExternalMemory, ...; CUDA 10 and later)");

  steps.next("the D3D12 adapter with that LUID, from DXGI");
  const auto adapters = dstorage::dxgi_adapters(why);
  if (adapters.empty()) return fail(why.empty() ? "DXGI lists no adapter" : why);
  const auto choice = dstorage::match_adapter(*luid, adapters);
  if (!choice.index) return fail(choice.reason);
  bridge->adapter = choice.reason;
  Com<IDXGIAdapter1> adapter(dstorage::dxgi_adapter_at(*choice.index, why));
  if (!adapter) return fail(why);

  steps.next("d3d12.dll's D3D12CreateDevice");
  const auto& d3d12 = shim::Direct3D12::get();
  if (!d3d12.usable) return fail(d3d12.why_unusable);

  steps.next("D3D12CreateDevice on " + adapters[*choice.index].name);
  void* out = nullptr;
  if (const HRESULT hr = d3d12.D3D12CreateDevice(adapter.get(), D3D_FEATURE_LEVEL_11_0,
                                                 __uuidof(ID3D12Device), &out);
      FAILED(hr) || !out)
    return fail(shim::hresult_text(hr));
  Com<ID3D12Device> device(static_cast<ID3D12Device*>(out));

  steps.next("a shared buffer of " + std::to_string(kBridgeBytes >> 20) +
             " MiB, ID3D12Device::CreateCommittedResource with D3D12_HEAP_FLAG_SHARED");
  D3D12_HEAP_PROPERTIES heap{};
  heap.Type = D3D12_HEAP_TYPE_DEFAULT;
  heap.CreationNodeMask = 1;
  heap.VisibleNodeMask = 1;
  D3D12_RESOURCE_DESC desc{};
  desc.Dimension = D3D12_RESOURCE_DIMENSION_BUFFER;
  desc.Width = kBridgeBytes;
  desc.Height = 1;
  desc.DepthOrArraySize = 1;
  desc.MipLevels = 1;
  desc.Format = DXGI_FORMAT_UNKNOWN;
  desc.SampleDesc.Count = 1;
  desc.Layout = D3D12_TEXTURE_LAYOUT_ROW_MAJOR;
  out = nullptr;
  if (const HRESULT hr = device->CreateCommittedResource(&heap, D3D12_HEAP_FLAG_SHARED, &desc,
                                                         D3D12_RESOURCE_STATE_COMMON, nullptr,
                                                         __uuidof(ID3D12Resource), &out);
      FAILED(hr) || !out)
    return fail(shim::hresult_text(hr));
  Com<ID3D12Resource> buffer(static_cast<ID3D12Resource*>(out));

  steps.next("the buffer's NT handle, ID3D12Device::CreateSharedHandle");
  HANDLE raw = nullptr;
  if (const HRESULT hr =
          device->CreateSharedHandle(buffer.get(), nullptr, GENERIC_ALL, nullptr, &raw);
      FAILED(hr))
    return fail(shim::hresult_text(hr));
  win32::Handle buffer_handle(raw);  // CUDA does not take it over: closed after the import

  steps.next("CUDA's import of the buffer, cuImportExternalMemory (D3D12_RESOURCE, dedicated)");
  device_context(ordinal).make_current();
  cu::ExternalMemoryHandleDesc memory_desc{};
  memory_desc.type = cu::kExternalMemoryHandleTypeD3D12Resource;
  memory_desc.handle.win32.handle = buffer_handle.get();
  memory_desc.size = device->GetResourceAllocationInfo(0, 1, &desc).SizeInBytes;
  memory_desc.flags = cu::kExternalMemoryDedicated;
  if (const cu::Result r = d.cuImportExternalMemory(&bridge->memory, &memory_desc);
      r != cu::kSuccess)
    return fail(cuda_failure(r));

  steps.next("the buffer's CUDA address, cuExternalMemoryGetMappedBuffer");
  cu::ExternalMemoryBufferDesc mapping{};
  mapping.size = kBridgeBytes;
  if (const cu::Result r =
          d.cuExternalMemoryGetMappedBuffer(&bridge->mapped, bridge->memory, &mapping);
      r != cu::kSuccess) {
    if (d.cuDestroyExternalMemory) d.cuDestroyExternalMemory(bridge->memory);
    return fail(cuda_failure(r));
  }

  // Past here a failure leaves the mapping and the import in place: the process keeps them, as it
  // would keep a working bridge (releasing CUDA objects on a half-built path gains 128 MiB once).
  steps.next("a shared fence, ID3D12Device::CreateFence with D3D12_FENCE_FLAG_SHARED");
  out = nullptr;
  if (const HRESULT hr =
          device->CreateFence(0, D3D12_FENCE_FLAG_SHARED, __uuidof(ID3D12Fence), &out);
      FAILED(hr) || !out)
    return fail(shim::hresult_text(hr));
  Com<ID3D12Fence> fence(static_cast<ID3D12Fence*>(out));

  steps.next("the fence's NT handle, ID3D12Device::CreateSharedHandle");
  raw = nullptr;
  if (const HRESULT hr =
          device->CreateSharedHandle(fence.get(), nullptr, GENERIC_ALL, nullptr, &raw);
      FAILED(hr))
    return fail(shim::hresult_text(hr));
  win32::Handle fence_handle(raw);

  steps.next("CUDA's import of the fence, cuImportExternalSemaphore (D3D12_FENCE)");
  cu::ExternalSemaphoreHandleDesc semaphore_desc{};
  semaphore_desc.type = cu::kExternalSemaphoreHandleTypeD3D12Fence;
  semaphore_desc.handle.win32.handle = fence_handle.get();
  if (const cu::Result r = d.cuImportExternalSemaphore(&bridge->semaphore, &semaphore_desc);
      r != cu::kSuccess)
    return fail(cuda_failure(r));

  bridge->device = device.release();
  bridge->buffer = buffer.release();
  bridge->fence = fence.release();
  return bridge;
}

}  // namespace

DirectStorageBridge* directstorage_bridge(int ordinal, std::string& error) {
  struct Made {
    std::unique_ptr<DirectStorageBridge> bridge;
    std::string error;
  };
  // Leaked on purpose: D3D12 and CUDA objects must outlive every static destructor.
  static auto* const made = new std::map<int, Made>();
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  auto [it, fresh] = made->try_emplace(ordinal);
  if (fresh) it->second.bridge = build(ordinal, it->second.error);
  error = it->second.error;
  return it->second.bridge.get();
}

void release_fence(DirectStorageBridge& bridge, std::uint64_t value) noexcept {
  if (bridge.fence->GetCompletedValue() < value) bridge.fence->Signal(value);
}

}  // namespace ferry::detail
