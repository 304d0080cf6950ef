// Paths to and from UTF-8, the one encoding of names in every ferry API. On POSIX the bytes are
// the path, unchanged (any bytes, as the kernel allows). On Windows they are converted to and
// from UTF-16: std::filesystem::path(std::string) would instead read them in the ANSI code page
// (MSVC) or byte by byte (mingw's libstdc++), and turn "modèle" into another, missing file.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace ferry {

inline std::filesystem::path path_from_utf8(std::string_view utf8) {
#ifdef _WIN32
  return std::filesystem::path(
      std::u8string(reinterpret_cast<const char8_t*>(utf8.data()), utf8.size()));
#else
  return std::filesystem::path(std::string(utf8));
#endif
}

inline std::string utf8_of(const std::filesystem::path& path) {
#ifdef _WIN32
  const std::u8string text = path.u8string();
  return std::string(text.begin(), text.end());
#else
  return path.string();
#endif
}

}  // namespace ferry
