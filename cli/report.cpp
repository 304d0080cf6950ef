#include "report.hpp"

#include <cmath>
#include <sstream>

namespace ferry::cli {
namespace {

// The length of the UTF-8 sequence at the start of `text`, or 0 where it is not one (overlong
// forms, surrogates and values past U+10FFFF included).
std::size_t utf8_length(std::string_view text) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char c = byte(0);
  std::size_t n = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
                               : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
  if (n == 0 || n > text.size()) return 0;
  for (std::size_t i = 1; i < n; ++i)
    if ((byte(i) & 0xC0) != 0x80) return 0;
  if ((c == 0xE0 && byte(1) < 0xA0) || (c == 0xED && byte(1) > 0x9F) ||
      (c == 0xF0 && byte(1) < 0x90) || (c == 0xF4 && byte(1) > 0x8F))
    return 0;
  return n;
}

}  // namespace

std::string printable(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const std::size_t n = utf8_length(text.substr(i));
    // C1 controls (U+0080 to U+009F) are two bytes, C2 80 to C2 9F; 0x9B alone is CSI too.
    const bool control = n == 1 ? (c < 0x20 || c == 0x7F)
                         : n == 2 ? (c == 0xC2 && static_cast<unsigned char>(text[i + 1]) < 0xA0)
                                  : false;
    if (n > 0 && !control) {
      out.append(text.substr(i, n));
      i += n;
      continue;
    }
    // Escape one byte; a control of two bytes shows both.
    const std::size_t bytes = n == 2 ? 2 : 1;
    for (std::size_t k = 0; k < bytes; ++k) {
      const auto b = static_cast<unsigned char>(text[i + k]);
      if (b == '\n') out += "\\n";
      else if (b == '\t') out += "\\t";
      else if (b == '\r') out += "\\r";
      else out += std::string("\\x") + kHex[b >> 4] + kHex[b & 15];
    }
    i += bytes;
  }
  return out;
}

CLI::Validator finite_between(double low, double high) {
  std::ostringstream range;
  range << low << " to " << high;
  const std::string allowed = range.str();
  return CLI::Validator(
      [low, high, allowed](std::string& text) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value)) return "\"" + text + "\" is not a number";
        if (!std::isfinite(value) || value < low || value > high)
          return "\"" + text + "\" is out of range: give a number from " + allowed;
        return {};
      },
      "NUMBER in " + allowed);
}

std::string human_bytes(std::uint64_t bytes) {
  char text[32];
  if (bytes >= 1000000000ull)
    std::snprintf(text, sizeof text, "%.2f GB", static_cast<double>(bytes) / 1e9);
  else if (bytes >= 1000000ull)
    std::snprintf(text, sizeof text, "%.1f MB", static_cast<double>(bytes) / 1e6);
  else
    std::snprintf(text, sizeof text, "%llu bytes", static_cast<unsigned long long>(bytes));
  return text;
}

std::string shape_text(const std::vector<std::uint64_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

void print_stats(std::FILE* out, const LoadStats& s, std::size_t tensor_count) {
  std::fprintf(out, "loaded %zu tensors, %s into %s in %.3f s: %.2f GB/s\n", tensor_count,
               human_bytes(s.tensor_bytes).c_str(), s.device.c_str(), s.seconds,
               s.gigabytes_per_second());
  std::fprintf(out, "staging: %s %s (allocated in %.3f s), %u reader threads, %s reads, %u slots each\n",
               human_bytes(s.staging_bytes).c_str(), s.staging_pinned ? "pinned" : "pageable",
               s.staging_seconds, s.reader_threads, human_bytes(s.chunk_bytes).c_str(),
               s.slots_per_thread);
  if (!s.settings_source.empty())
    std::fprintf(out, "settings: %s\n", printable(s.settings_source).c_str());
  if (s.bytes_from_registered_page_cache > 0 || s.page_cache_register_seconds > 0)
    std::fprintf(out,
                 "page-cache DMA: %s copied from registered page-cache mappings (registering "
                 "took %.3f s)\n",
                 human_bytes(s.bytes_from_registered_page_cache).c_str(),
                 s.page_cache_register_seconds);
  for (const auto& f : s.files)
    std::fprintf(out, "path: %s %s (%s)\n", printable(f.path.string()).c_str(),
                 std::string(io_path_name(f.io_path)).c_str(), printable(f.reason).c_str());
}

nlohmann::json stats_json(const LoadStats& s) { return nlohmann::json::parse(to_json(s)); }

}  // namespace ferry::cli
