#include "ferry/fanout_load.hpp"
#include "load/stats_json.hpp"

namespace ferry {

std::string to_json(const FanoutStats& s) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : s.ranks)
    ranks.push_back({{"device", r.device},
                     {"tensor_bytes", r.tensor_bytes},
                     {"link_bytes", r.link_bytes},
                     {"peer_bytes", r.peer_bytes},
                     {"seconds", r.seconds},
                     {"gigabytes_per_second", r.gigabytes_per_second()}});
  const FanoutPhases& p = s.phases;
  const nlohmann::json phases = {{"read_thread_seconds", p.read_thread_seconds},
                                 {"wait_thread_seconds", p.wait_thread_seconds},
                                 {"queue_thread_seconds", p.queue_thread_seconds},
                                 {"setup_thread_seconds", p.setup_thread_seconds},
                                 {"staging_seconds", p.staging_seconds},
                                 {"reads_seconds", p.reads_seconds},
                                 {"tail_seconds", p.tail_seconds},
                                 {"loader_wait_seconds", p.loader_wait_seconds},
                                 {"pool_threads", p.pool_threads}};
  const nlohmann::json j = {
      {"collective", s.collective},
      {"seconds", s.seconds},
      {"gigabytes_per_second", s.gigabytes_per_second()},
      {"collective_setup_seconds", s.collective_setup_seconds},
      {"collective_seconds", s.collective_seconds},
      {"allocate_seconds", s.allocate_seconds},
      {"bytes_read", s.bytes_read},
      {"bytes_from_registered_page_cache", s.bytes_from_registered_page_cache},
      {"page_cache_register_seconds", s.page_cache_register_seconds},
      {"direct_streams", s.direct_streams},
      {"checkpoint_bytes", s.checkpoint_bytes},
      {"tensor_bytes", s.tensor_bytes},
      {"rounds", s.rounds},
      {"reader_threads", s.reader_threads},
      {"chunk_bytes", s.chunk_bytes},
      {"settings_source", s.settings_source},
      {"next_round", s.next_round},
      {"submissions", s.submissions},
      {"phases", phases},
      {"timeline", s.timeline},
      {"ranks", ranks},
      {"files", detail::files_json(s.files)}};
  return detail::dump_json(j);
}

}  // namespace ferry
