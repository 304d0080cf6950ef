#include "shim/d3d12.hpp"

#include "shim/dynamic_library.hpp"

namespace ferry::shim {

const Direct3D12& Direct3D12::get() {
  static const Direct3D12 d3d12 = [] {
    Direct3D12 d;
    void* library = open_vendor_library({"d3d12.dll"}, d.why_unusable);
    d.usable = library != nullptr && resolve(library, "d3d12.dll", "D3D12CreateDevice",
                                             d.D3D12CreateDevice, d.why_unusable);
    return d;
  }();
  return d3d12;
}

}  // namespace ferry::shim
