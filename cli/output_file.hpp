// A file a command writes its results to (`kv bench --json FILE`): opened when the command
// starts, so a path that cannot be written (a directory, a missing folder) fails before the work,
// and written at the end with the write, the flush and the close checked, so a full disk or
// /dev/full is an error naming the file, never exit 0 with nothing written.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace ferry::cli {

class OutputFile {
 public:
  // Opens (creates or truncates) `utf8_path`. Throws std::system_error naming it.
  explicit OutputFile(std::string_view utf8_path);
  // Writes `text`, flushes and closes. Throws std::system_error naming the file.
  void write_and_close(std::string_view text);

 private:
  [[noreturn]] void fail(const char* what) const;

  std::filesystem::path _path;
  std::ofstream _out;
};

}  // namespace ferry::cli
