#include "report.hpp"

namespace ferry::cli {

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
    std::fprintf(out, "settings: %s\n", s.settings_source.c_str());
  for (const auto& f : s.files)
    std::fprintf(out, "path: %s %s (%s)\n", f.path.c_str(), std::string(io_path_name(f.io_path)).c_str(),
                 f.reason.c_str());
}

nlohmann::json stats_json(const LoadStats& s) { return nlohmann::json::parse(to_json(s)); }

}  // namespace ferry::cli
