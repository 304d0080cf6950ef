#include "progress.hpp"

#ifdef _WIN32
#include <io.h>
#else
#include <unistd.h>
#endif

#include <cstdio>

#include "report.hpp"

namespace ferry::cli {

Progress::Progress(std::string label)
    : _label(std::move(label)),
#ifdef _WIN32
      _terminal(::_isatty(::_fileno(stderr)) != 0),
#else
      _terminal(::isatty(STDERR_FILENO) == 1),
#endif
      _start(std::chrono::steady_clock::now()),
      _last_draw(_start) {
}

void Progress::update(std::uint64_t done, std::uint64_t total) {
  const auto now = std::chrono::steady_clock::now();
  const double fraction = total ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
  const double seconds = std::chrono::duration<double>(now - _start).count();
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds / 1e9 : 0.0;
  if (_terminal) {
    if (now - _last_draw < std::chrono::milliseconds(100) && done < total) return;
    _last_draw = now;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(fraction * kWidth);
    std::fprintf(stderr, "\r%s [%.*s%*s] %3d%% %6.2f GB/s", _label.c_str(), filled,
                 "##############################", kWidth - filled, "",
                 static_cast<int>(fraction * 100), rate);
    _drawn = true;
    return;
  }
  const int tenth = static_cast<int>(fraction * 10);
  if (tenth == _last_tenth) return;
  _last_tenth = tenth;
  std::fprintf(stderr, "%s: %d%% (%s, %.2f GB/s)\n", _label.c_str(), tenth * 10,
               human_bytes(done).c_str(), rate);
}

void Progress::finish() {
  if (_drawn) std::fputc('\n', stderr);
  _drawn = false;
}

}  // namespace ferry::cli
