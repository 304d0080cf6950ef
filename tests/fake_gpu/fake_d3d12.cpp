// A stand-in for d3d12.dll, for tests under Wine: a device whose committed buffers and fences are
// Windows file mappings (their shared NT handles are the mappings, which the stand-in CUDA driver
// maps too, so both see the same bytes). Only the methods the DirectStorage bridge calls are
// real; the other vtable slots answer E_NOTIMPL. The slot order is d3d12.h's (its ABI).
#define WIDL_EXPLICIT_AGGREGATE_RETURNS
#include <d3d12.h>
#include <windows.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>

namespace {

#define FAKE_UNUSED(n) \
  virtual HRESULT STDMETHODCALLTYPE unused_##n() { return E_NOTIMPL; }

std::mutex registry_mutex;
std::map<void*, HANDLE>& mappings() {  // object -> its file mapping
  static auto* m = new std::map<void*, HANDLE>();
  return *m;
}

HANDLE new_mapping(std::uint64_t bytes, void** view) {
  HANDLE h =
      ::CreateFileMappingW(INVALID_HANDLE_VALUE, nullptr, PAGE_READWRITE,
                           static_cast<DWORD>(bytes >> 32), static_cast<DWORD>(bytes), nullptr);
  if (!h) return nullptr;
  *view = ::MapViewOfFile(h, FILE_MAP_ALL_ACCESS, 0, 0, bytes);
  return h;
}

struct Unknown {
  virtual HRESULT STDMETHODCALLTYPE QueryInterface(REFIID, void** out) {
    *out = this;
    AddRef();
    return S_OK;
  }
  virtual ULONG STDMETHODCALLTYPE AddRef() { return ++references; }
  virtual ULONG STDMETHODCALLTYPE Release() { return --references; }  // kept: tests are short
  std::atomic<ULONG> references{1};
};

struct Resource : Unknown {  // ID3D12Resource
  FAKE_UNUSED(4)
  FAKE_UNUSED(5) FAKE_UNUSED(6) FAKE_UNUSED(7) FAKE_UNUSED(8) virtual HRESULT STDMETHODCALLTYPE
      Map(UINT, const D3D12_RANGE*, void** data) {
    *data = memory;
    return S_OK;
  }
  void* memory = nullptr;
};

struct Fence : Unknown {  // ID3D12Fence
  FAKE_UNUSED(4)
  FAKE_UNUSED(5) FAKE_UNUSED(6) FAKE_UNUSED(7) FAKE_UNUSED(8) virtual UINT64 STDMETHODCALLTYPE
      GetCompletedValue() {
    return reinterpret_cast<std::atomic<UINT64>*>(value)->load();
  }
  FAKE_UNUSED(10)
  virtual HRESULT STDMETHODCALLTYPE Signal(UINT64 v) {
    reinterpret_cast<std::atomic<UINT64>*>(value)->store(v);
    return S_OK;
  }
  void* value = nullptr;
};

struct Device : Unknown {  // ID3D12Device
  FAKE_UNUSED(4)
  FAKE_UNUSED(5) FAKE_UNUSED(6) FAKE_UNUSED(7) FAKE_UNUSED(8) FAKE_UNUSED(9) FAKE_UNUSED(10)
      FAKE_UNUSED(11) FAKE_UNUSED(12) FAKE_UNUSED(13) FAKE_UNUSED(14) FAKE_UNUSED(15)
          FAKE_UNUSED(16) FAKE_UNUSED(17) FAKE_UNUSED(18) FAKE_UNUSED(19) FAKE_UNUSED(20)
              FAKE_UNUSED(21) FAKE_UNUSED(22) FAKE_UNUSED(23) FAKE_UNUSED(24)
                  FAKE_UNUSED(25) virtual D3D12_RESOURCE_ALLOCATION_INFO* STDMETHODCALLTYPE
      GetResourceAllocationInfo(D3D12_RESOURCE_ALLOCATION_INFO* info, UINT, UINT,
                                const D3D12_RESOURCE_DESC* desc) {
    info->SizeInBytes = (desc->Width + 65535) / 65536 * 65536;
    info->Alignment = 65536;
    return info;
  }
  FAKE_UNUSED(27)
  virtual HRESULT STDMETHODCALLTYPE CreateCommittedResource(
      const D3D12_HEAP_PROPERTIES*, D3D12_HEAP_FLAGS flags, const D3D12_RESOURCE_DESC* desc,
      D3D12_RESOURCE_STATES, const D3D12_CLEAR_VALUE*, REFIID, void** out) {
    if (!(flags & D3D12_HEAP_FLAG_SHARED) || desc->Dimension != D3D12_RESOURCE_DIMENSION_BUFFER)
      return E_INVALIDARG;
    auto* r = new Resource();
    HANDLE h = new_mapping(desc->Width, &r->memory);
    if (!h) return E_OUTOFMEMORY;
    std::lock_guard lock(registry_mutex);
    mappings()[r] = h;
    *out = r;
    return S_OK;
  }
  FAKE_UNUSED(29)
  FAKE_UNUSED(30) FAKE_UNUSED(31) virtual HRESULT STDMETHODCALLTYPE
      CreateSharedHandle(void* object, const SECURITY_ATTRIBUTES*, DWORD, const WCHAR*,
                         HANDLE* out) {
    std::lock_guard lock(registry_mutex);
    const auto it = mappings().find(object);
    if (it == mappings().end()) return E_INVALIDARG;
    return ::DuplicateHandle(::GetCurrentProcess(), it->second, ::GetCurrentProcess(), out, 0,
                             FALSE, DUPLICATE_SAME_ACCESS)
               ? S_OK
               : E_FAIL;
  }
  FAKE_UNUSED(33)
  FAKE_UNUSED(34) FAKE_UNUSED(35) FAKE_UNUSED(36) virtual HRESULT STDMETHODCALLTYPE
      CreateFence(UINT64 initial, D3D12_FENCE_FLAGS flags, REFIID, void** out) {
    if (!(flags & D3D12_FENCE_FLAG_SHARED)) return E_INVALIDARG;
    auto* f = new Fence();
    HANDLE h = new_mapping(sizeof(UINT64), &f->value);
    if (!h) return E_OUTOFMEMORY;
    f->Signal(initial);
    std::lock_guard lock(registry_mutex);
    mappings()[f] = h;
    *out = f;
    return S_OK;
  }
};

}  // namespace

extern "C" __declspec(dllexport) HRESULT WINAPI
    D3D12CreateDevice(IUnknown* adapter, D3D_FEATURE_LEVEL, REFIID, void** out) {
  if (!adapter) return E_INVALIDARG;  // the bridge always names its adapter
  *out = new Device();
  return S_OK;
}
