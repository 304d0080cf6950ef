// DirectStorage for Windows, loaded at run time: dstorage.dll (and the dstoragecore.dll it
// loads) from beside ferry.dll, beside the program or the safe DLL directories; never linked,
// never unloaded. Its factory is a process-wide singleton, kept for the life of the process.
#pragma once

#include <string>

#include "shim/dstorage_api.hpp"

namespace ferry::shim {

struct DirectStorageLibrary {
  bool usable = false;
  std::string why_unusable;
  std::string loaded_from;
  dstorage::IDStorageFactory* factory = nullptr;

  static const DirectStorageLibrary& get();
};

std::string hresult_text(HRESULT hr);

}  // namespace ferry::shim
