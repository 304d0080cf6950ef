// The I/O vocabulary's names (ferry/io_types.hpp).
#include "ferry/io_types.hpp"

#include <stdexcept>

#include "ferry/error.hpp"

namespace ferry {

IoMode parse_io_mode(std::string_view text) {
  if (text == "auto") return IoMode::Auto;
  if (text == "direct") return IoMode::Direct;
  if (text == "buffered") return IoMode::Buffered;
  detail::fail<std::invalid_argument>("unknown I/O mode \"", text,
                                      "\": expected auto, direct or buffered");
}

Backend parse_backend(std::string_view text) {
  if (text == "auto") return Backend::Auto;
  if (text == "cufile") return Backend::Cufile;
  if (text == "posix") return Backend::Posix;
  // "dstorage": the name of Microsoft's DLL, which users and the issue use for it too.
  if (text == "directstorage" || text == "dstorage") return Backend::DirectStorage;
  detail::fail<std::invalid_argument>(
      "unknown backend \"", text, "\": expected auto, cufile, posix or directstorage (dstorage)");
}

std::string_view io_path_name(IoPath path) {
  switch (path) {
    case IoPath::Direct:
      return "odirect";
    case IoPath::Buffered:
      return "buffered";
    case IoPath::CufileGds:
      return "cufile-gds";
    case IoPath::CufileCompat:
      return "cufile-compat";
    case IoPath::DirectStorage:
      return "directstorage";
    case IoPath::PageCacheDma:
      return "page-cache-dma";
  }
  return "unknown";
}

}  // namespace ferry
