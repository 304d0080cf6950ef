// Direct3D 12, loaded at run time (d3d12.dll, Windows 10 and later): the one entry point the
// DirectStorage bridge needs (backends/dstorage/dstorage_bridge.cpp). Never linked, never unloaded.
#pragma once

#include <string>

#include "platform/windows/win32.hpp"
// windows.h first. The explicit form of aggregate returns: mingw's d3d12.h otherwise declares
// methods such as GetResourceAllocationInfo returning their struct by value, which the COM ABI
// does not.
#define WIDL_EXPLICIT_AGGREGATE_RETURNS
#include <d3d12.h>

namespace ferry::shim {

struct Direct3D12 {
  bool usable = false;
  std::string why_unusable;
  PFN_D3D12_CREATE_DEVICE D3D12CreateDevice = nullptr;

  static const Direct3D12& get();
};

}  // namespace ferry::shim
