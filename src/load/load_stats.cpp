#include "ferry/load_stats.hpp"

#include <algorithm>

#include "load/stats_json.hpp"

namespace ferry {

namespace detail {

nlohmann::json files_json(const std::vector<FileLoadStats>& files) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& f : files)
    out.push_back({{"path", f.path.string()},
                   {"io_path", io_path_name(f.io_path)},
                   {"reason", f.reason},
                   {"bytes_read", f.bytes_read}});
  return out;
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace detail

void add_pipeline_phases(const PipelineTimes& p, double submitted,
                         std::vector<std::pair<std::string, double>>& timeline,
                         std::string_view prefix) {
  const std::pair<const char*, double> phases[] = {
      {"page_cache_leased", p.page_cache_leased}, {"first_worker", p.first_job},
      {"last_worker", p.last_job},                {"staging_ready", p.staging_ready},
      {"streams_ready", p.streams_ready},         {"first_read", p.first_read},
      {"first_copy", p.first_copy},               {"last_read", p.last_read},
      {"last_copy", p.last_copy},                 {"copies_done", p.copies_done},
      {"submission_done", p.done}};
  std::vector<std::pair<std::string, double>> reached;
  for (const auto& [name, t] : phases)
    if (t > 0) reached.emplace_back(std::string(prefix) + name, submitted + t);
  std::stable_sort(reached.begin(), reached.end(),
                   [](const auto& a, const auto& b) { return a.second < b.second; });
  timeline.insert(timeline.end(), reached.begin(), reached.end());
}

std::string to_json(const LoadStats& s) {
  const PipelineTimes& p = s.pipeline;
  const nlohmann::json pipeline = {
      {"page_cache_leased", p.page_cache_leased},
      {"first_job", p.first_job},   {"last_job", p.last_job},
      {"staging_ready", p.staging_ready},
      {"streams_ready", p.streams_ready},
      {"first_read", p.first_read}, {"first_copy", p.first_copy},   {"last_read", p.last_read},
      {"last_copy", p.last_copy},   {"copies_done", p.copies_done}, {"done", p.done},
      {"copy_span", p.copy_span},   {"copy_busy", p.copy_busy},     {"copy_groups", p.copy_groups}};
  const nlohmann::json j = {{"device", s.device},
                            {"tensor_bytes", s.tensor_bytes},
                            {"allocated_bytes", s.allocated_bytes},
                            {"bytes_read", s.bytes_read},
                            {"seconds", s.seconds},
                            {"gigabytes_per_second", s.gigabytes_per_second()},
                            {"staging_seconds", s.staging_seconds},
                            {"staging_bytes", s.staging_bytes},
                            {"staging_pinned", s.staging_pinned},
                            {"reader_threads", s.reader_threads},
                            {"slots_per_thread", s.slots_per_thread},
                            {"settings_source", s.settings_source},
                            {"allocate_seconds", s.allocate_seconds},
                            {"open_seconds", s.open_seconds},
                            {"setup_thread_seconds", s.setup_thread_seconds},
                            {"read_thread_seconds", s.read_thread_seconds},
                            {"wait_thread_seconds", s.wait_thread_seconds},
                            {"queue_thread_seconds", s.queue_thread_seconds},
                            {"chunk_bytes", s.chunk_bytes},
                            {"submit_seconds", s.submit_seconds},
                            {"bytes_from_registered_page_cache",
                             s.bytes_from_registered_page_cache},
                            {"page_cache_register_seconds", s.page_cache_register_seconds},
                            {"pipeline_seconds", pipeline},
                            {"timeline", s.timeline},
                            {"files", detail::files_json(s.files)}};
  return detail::dump_json(j);
}

}  // namespace ferry
