#include "shim/dstorage.hpp"

#include <cstdio>

#include "shim/dstorage_availability.hpp"
#include "shim/dynamic_library.hpp"

namespace ferry::shim {
namespace {

// The folder of the module holding this code (ferry.dll, or the program linking ferry
// statically): a host such as Go's loader ships dstorage.dll beside ferry.dll, which Windows
// would not search otherwise.
std::wstring own_folder() {
  HMODULE self = nullptr;
  if (!::GetModuleHandleExW(
          GET_MODULE_HANDLE_EX_FLAG_FROM_ADDRESS | GET_MODULE_HANDLE_EX_FLAG_UNCHANGED_REFCOUNT,
          reinterpret_cast<LPCWSTR>(&own_folder), &self))
    return {};
  wchar_t path[MAX_PATH];
  const DWORD n = ::GetModuleFileNameW(self, path, MAX_PATH);
  if (n == 0 || n == MAX_PATH) return {};
  std::wstring folder(path, n);
  return folder.substr(0, folder.find_last_of(L"\\/") + 1);
}

DirectStorageLibrary load() {
  DirectStorageLibrary l;
  HMODULE dll = nullptr;
  const std::wstring beside = own_folder() + L"dstorage.dll";
  // LOAD_LIBRARY_SEARCH_DLL_LOAD_DIR: dstoragecore.dll is then found beside dstorage.dll.
  if (!own_folder().empty())
    dll = ::LoadLibraryExW(beside.c_str(), nullptr,
                           LOAD_LIBRARY_SEARCH_DLL_LOAD_DIR | LOAD_LIBRARY_SEARCH_DEFAULT_DIRS);
  if (dll) {
    l.loaded_from = detail::win32::narrow(beside);
  } else {
    std::string why;
    dll = static_cast<HMODULE>(open_vendor_library({"dstorage.dll"}, why));
    if (!dll) {
      l.why_unusable = "DirectStorage is not available: " + why +
                       "; put Microsoft's redistributable dstorage.dll and dstoragecore.dll "
                       "beside ferry.dll or the program";
      return l;
    }
    l.loaded_from = "dstorage.dll";
  }
  dstorage::GetFactoryFn get_factory = nullptr;
  if (!resolve(dll, "dstorage.dll", "DStorageGetFactory", get_factory, l.why_unusable)) {
    l.why_unusable = "DirectStorage is not available: " + l.why_unusable;
    return l;
  }
  void* factory = nullptr;
  const HRESULT hr = get_factory(dstorage::kIidFactory, &factory);
  if (FAILED(hr) || factory == nullptr) {
    l.why_unusable =
        "DirectStorage is not available: DStorageGetFactory failed (" + hresult_text(hr) + ")";
    return l;
  }
  l.factory = static_cast<dstorage::IDStorageFactory*>(factory);
  l.usable = true;
  return l;
}

}  // namespace

const DirectStorageLibrary& DirectStorageLibrary::get() {
  static const DirectStorageLibrary library = load();
  return library;
}

std::string hresult_text(HRESULT hr) {
  char code[16];
  std::snprintf(code, sizeof code, "0x%08lx", static_cast<unsigned long>(hr));
  return std::string("HRESULT ") + code + ": " + detail::win32::message_of(static_cast<DWORD>(hr));
}

}  // namespace ferry::shim

namespace ferry::dstorage {

const Availability& availability() {
  static const Availability a = [] {
    const auto& l = shim::DirectStorageLibrary::get();
    return l.usable ? Availability{true, "dstorage.dll loaded (" + l.loaded_from + ")"}
                    : Availability{false, l.why_unusable};
  }();
  return a;
}

}  // namespace ferry::dstorage
