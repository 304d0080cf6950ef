// How the shim opens vendor libraries: never linked, never closed. On POSIX dlopen with
// RTLD_LAZY | RTLD_LOCAL | RTLD_NODELETE; on Windows LoadLibraryExW limited to the safe
// directories (the application's, System32 and those added with AddDllDirectory, never the
// current directory), whose handle is simply never freed. Typed lookups record the first
// missing symbol.
#pragma once

#ifdef _WIN32
#include "platform/windows/win32.hpp"
#else
#include <dlfcn.h>
#endif

#include <initializer_list>
#include <string>

namespace ferry::shim {

// The first of `names` that opens, or null with the reason in `why`.
inline void* open_vendor_library(std::initializer_list<const char*> names, std::string& why) {
#ifdef _WIN32
  DWORD error = ERROR_MOD_NOT_FOUND;
  for (const char* name : names) {
    const std::wstring wide = detail::win32::widen(name);
    if (HMODULE library = ::LoadLibraryExW(wide.c_str(), nullptr, LOAD_LIBRARY_SEARCH_DEFAULT_DIRS))
      return reinterpret_cast<void*>(library);
    error = ::GetLastError();
  }
  why = std::string(*names.begin()) + " was not found (" + detail::win32::message_of(error) + ")";
  return nullptr;
#else
  for (const char* name : names)
    if (void* library = ::dlopen(name, RTLD_LAZY | RTLD_LOCAL | RTLD_NODELETE)) return library;
  const char* err = ::dlerror();
  why = std::string(*names.begin()) + " was not found (" + (err ? err : "dlopen failed") + ")";
  return nullptr;
#endif
}

// The address of `symbol` in `library`, or null.
inline void* find_symbol(void* library, const char* symbol) {
#ifdef _WIN32
  return reinterpret_cast<void*>(::GetProcAddress(static_cast<HMODULE>(library), symbol));
#else
  return ::dlsym(library, symbol);
#endif
}

// Resolves `symbol` into `slot`; false, with the reason recorded once, when it is missing.
template <class Fn>
bool resolve(void* library, const char* library_name, const char* symbol, Fn& slot,
             std::string& why) {
  slot = reinterpret_cast<Fn>(find_symbol(library, symbol));
  if (slot == nullptr && why.empty()) why = std::string(library_name) + " lacks " + symbol;
  return slot != nullptr;
}

}  // namespace ferry::shim
