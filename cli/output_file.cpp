#include "output_file.hpp"

#include <cerrno>
#include <system_error>

#include "ferry/utf8_path.hpp"

namespace ferry::cli {

OutputFile::OutputFile(std::string_view utf8_path) : _path(path_from_utf8(utf8_path)) {
  errno = 0;
  _out.open(_path, std::ios::binary | std::ios::trunc);
  if (!_out.is_open()) fail("cannot open for writing");
}

void OutputFile::write_and_close(std::string_view text) {
  errno = 0;
  _out.write(text.data(), static_cast<std::streamsize>(text.size()));
  _out.flush();
  if (!_out) fail("cannot write");
  _out.close();
  if (!_out) fail("cannot close");
}

void OutputFile::fail(const char* what) const {
  // The stream keeps no error code; the failed system call left it in errno.
  const int error = errno != 0 ? errno : EIO;
  throw std::system_error(error, std::generic_category(), utf8_of(_path) + ": " + what);
}

}  // namespace ferry::cli
