// A stand-in for dxgi.dll, for tests under Wine: two adapters, the first an integrated GPU (the
// default a laptop would offer) and the second the stand-in CUDA device (fake_nvcuda.cpp reports
// its LUID, 0x1234), so that matching by LUID is what picks it. Slot order: dxgi.h's.
#include <dxgi.h>
#include <windows.h>

#include <atomic>
#include <cwchar>

namespace {

#define FAKE_UNUSED(n) \
  virtual HRESULT STDMETHODCALLTYPE unused_##n() { return E_NOTIMPL; }

struct Unknown {
  virtual HRESULT STDMETHODCALLTYPE QueryInterface(REFIID, void** out) {
    *out = this;
    AddRef();
    return S_OK;
  }
  virtual ULONG STDMETHODCALLTYPE AddRef() { return ++references; }
  // Never deleted (tests are short): a virtual destructor would take vtable slots 4 and 5.
  virtual ULONG STDMETHODCALLTYPE Release() { return --references; }
  std::atomic<ULONG> references{1};
};

struct Adapter : Unknown {  // IDXGIAdapter1
  Adapter(const wchar_t* name, DWORD luid) : name(name), luid(luid) {}
  FAKE_UNUSED(4)
  FAKE_UNUSED(5) FAKE_UNUSED(6) FAKE_UNUSED(7) FAKE_UNUSED(8) FAKE_UNUSED(9)
      FAKE_UNUSED(10) virtual HRESULT STDMETHODCALLTYPE GetDesc1(DXGI_ADAPTER_DESC1* desc) {
    *desc = {};
    std::wcsncpy(desc->Description, name, 127);
    desc->AdapterLuid.LowPart = luid;
    return S_OK;
  }
  const wchar_t* name;
  DWORD luid;
};

struct Factory : Unknown {  // IDXGIFactory1
  FAKE_UNUSED(4)
  FAKE_UNUSED(5) FAKE_UNUSED(6) FAKE_UNUSED(7) FAKE_UNUSED(8) FAKE_UNUSED(9) FAKE_UNUSED(10)
      FAKE_UNUSED(11) FAKE_UNUSED(12) virtual HRESULT STDMETHODCALLTYPE
      EnumAdapters1(UINT index, void** out) {
    if (index == 0)
      *out = new Adapter(L"Stand-in integrated GPU", 0x99);
    else if (index == 1)
      *out = new Adapter(L"Stand-in CUDA GPU", 0x1234);
    else
      return DXGI_ERROR_NOT_FOUND;
    return S_OK;
  }
};

}  // namespace

extern "C" __declspec(dllexport) HRESULT WINAPI CreateDXGIFactory1(REFIID, void** out) {
  *out = new Factory();
  return S_OK;
}
