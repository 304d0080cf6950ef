// Whether DirectStorage can run in this process, and why not: on Windows, whether Microsoft's
// redistributable dstorage.dll loads and hands out its factory (shim/dstorage.cpp); elsewhere
// never (backends/dstorage/dstorage_unavailable.cpp). What the route, `ferry doctor` and the tests ask.
#pragma once

#include <string>

namespace ferry::dstorage {

struct Availability {
  bool usable = false;
  std::string reason;  // what was found, or what is missing
};

const Availability& availability();

}  // namespace ferry::dstorage
