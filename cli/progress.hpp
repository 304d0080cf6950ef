// Load progress on stderr: a redrawn bar on a terminal, a plain line per tenth otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace ferry::cli {

class Progress {
 public:
  explicit Progress(std::string label);
  void update(std::uint64_t done, std::uint64_t total);
  void finish();

 private:
  std::string _label;
  bool _terminal;
  int _last_tenth = -1;
  bool _drawn = false;
  std::chrono::steady_clock::time_point _start;
  std::chrono::steady_clock::time_point _last_draw;
};

}  // namespace ferry::cli
