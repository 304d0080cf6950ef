#include "ferry/load_stats.hpp"

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

std::string to_json(const LoadStats& s) {
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
                            {"files", detail::files_json(s.files)}};
  return detail::dump_json(j);
}

}  // namespace ferry
