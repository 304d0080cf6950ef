// How the shim opens vendor libraries: dlopen with RTLD_LAZY | RTLD_LOCAL | RTLD_NODELETE (never
// closed, never linked), and typed lookups that record the first missing symbol.
#pragma once

#include <dlfcn.h>

#include <initializer_list>
#include <string>

namespace ferry::shim {

// The first of `names` that opens, or null with the reason in `why`.
inline void* open_vendor_library(std::initializer_list<const char*> names, std::string& why) {
  for (const char* name : names)
    if (void* library = ::dlopen(name, RTLD_LAZY | RTLD_LOCAL | RTLD_NODELETE)) return library;
  const char* err = ::dlerror();
  why = std::string(*names.begin()) + " was not found (" + (err ? err : "dlopen failed") + ")";
  return nullptr;
}

// Resolves `symbol` into `slot`; false, with the reason recorded once, when it is missing.
template <class Fn>
bool resolve(void* library, const char* library_name, const char* symbol, Fn& slot,
             std::string& why) {
  slot = reinterpret_cast<Fn>(::dlsym(library, symbol));
  if (slot == nullptr && why.empty()) why = std::string(library_name) + " lacks " + symbol;
  return slot != nullptr;
}

}  // namespace ferry::shim
