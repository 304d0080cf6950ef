#include "load_fanout.hpp"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <vector>

#include "ferry/fanout_load.hpp"
#include "ferry/ggml_type.hpp"
#include "ferry/tensor_digest.hpp"
#include "progress.hpp"
#include "report.hpp"

namespace ferry::cli {
namespace {

std::vector<Device> parse_devices(const std::string& text) {
  std::vector<Device> devices;
  std::size_t at = 0;
  while (true) {
    const std::size_t comma = text.find(',', at);
    devices.push_back(Device::parse(text.substr(at, comma - at)));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return devices;
}

void print_stats(std::FILE* out, const FanoutStats& s, bool tensor_parallel) {
  std::fprintf(out, "loaded %s onto %zu devices (%s) in %.3f s: %.2f GB/s aggregate\n",
               human_bytes(s.checkpoint_bytes).c_str(), s.ranks.size(),
               tensor_parallel ? "tensor-parallel slices" : "replicas", s.seconds,
               s.gigabytes_per_second());
  std::fprintf(out, "read from storage: %s (%.3f x the checkpoint)\n",
               human_bytes(s.bytes_read).c_str(),
               s.checkpoint_bytes ? static_cast<double>(s.bytes_read) / s.checkpoint_bytes : 0.0);
  if (s.bytes_from_registered_page_cache > 0)
    std::fprintf(out,
                 "page-cache DMA: %s copied by the GPUs straight from registered page-cache "
                 "mappings (no staging), %u streams per GPU; %.3f s registering files in this "
                 "load\n",
                 human_bytes(s.bytes_from_registered_page_cache).c_str(), s.direct_streams,
                 s.page_cache_register_seconds);
  for (const auto& r : s.ranks)
    std::fprintf(out, "%s: holds %s (%.2f GB/s); host link %s, from other GPUs %s\n",
                 r.device.c_str(), human_bytes(r.tensor_bytes).c_str(), r.gigabytes_per_second(),
                 human_bytes(r.link_bytes).c_str(), human_bytes(r.peer_bytes).c_str());
  std::fprintf(out, "collectives: %s, %.3f s of device time in %zu rounds (started in %.3f s)\n",
               s.collective.c_str(), s.collective_seconds, s.rounds, s.collective_setup_seconds);
  std::fprintf(out, "engine: %u reader threads, %s reads; settings: %s\n", s.reader_threads,
               human_bytes(s.chunk_bytes).c_str(), printable(s.settings_source).c_str());
  const FanoutPhases& p = s.phases;
  const double busy = p.read_thread_seconds + p.wait_thread_seconds + p.queue_thread_seconds +
                      p.setup_thread_seconds;
  std::fprintf(out,
               "phases: reads %.3f s (next round %s, submissions %s; %.1f readers busy on "
               "average: reading %.3f, waiting for copies %.3f, queueing %.3f, setup %.3f "
               "thread-s), then collectives %.3f s; %u pool threads\n",
               p.reads_seconds, s.next_round.c_str(), s.submissions.c_str(),
               p.reads_seconds > 0 ? busy / p.reads_seconds : 0.0, p.read_thread_seconds,
               p.wait_thread_seconds, p.queue_thread_seconds, p.setup_thread_seconds,
               p.tail_seconds, p.pool_threads);
  for (const auto& f : s.files)
    std::fprintf(out, "path: %s %s (%s)\n", printable(f.path.string()).c_str(),
                 std::string(io_path_name(f.io_path)).c_str(), printable(f.reason).c_str());
}

// As `ferry load --hash` for one device, each line led by the rank's device; a slice's shape is
// the slice's.
void print_digests(const FanoutLoad& loaded) {
  for (const LoadedRank& rank : loaded.ranks()) {
    std::vector<const LoadedShard*> sorted;
    for (const auto& t : rank.tensors()) sorted.push_back(&t);
    std::sort(sorted.begin(), sorted.end(), [](const auto* a, const auto* b) {
      return a->piece->info->name < b->piece->info->name;
    });
    for (const LoadedShard* t : sorted) {
      const TensorInfo& info = *t->piece->info;
      const bool gguf = info.ggml_type >= 0;
      const bool whole = t->piece->replicated();
      std::printf(
          "%s\t%s\t%s\t%s\t%s\n", rank.device().to_string().c_str(), printable(info.name).c_str(),
          std::string(gguf ? ggml_type_name(info.ggml_type) : dtype_name(info.dtype)).c_str(),
          shape_text(whole && gguf ? info.ggml_dims : t->piece->shape).c_str(),
          digest_hex(memory_digest(rank.device(), t->data, t->piece->bytes)).c_str());
    }
  }
}

}  // namespace

bool lists_several_devices(const std::string& device) {
  return device.find(',') != std::string::npos;
}

void run_fanout_load(const FanoutRequest& request) {
  FanoutOptions options;
  options.load = request.options;
  options.devices = parse_devices(request.devices);
  options.rule =
      request.tensor_parallel ? ShardRule(llama_tensor_parallel) : ShardRule(replicate_all);
  options.round_bytes = request.round_bytes;
  options.next_round = request.next_round_at_tail ? FanoutOptions::NextRound::AtTail
                                                  : FanoutOptions::NextRound::Eager;
  options.submissions = request.per_device ? FanoutOptions::Submissions::PerDevice
                                           : FanoutOptions::Submissions::PerRound;
  auto checkpoint = Checkpoint::open_shared(request.path);
  std::FILE* report = request.hash ? stderr : stdout;
  nlohmann::json runs = nlohmann::json::array();
  std::vector<FanoutLoad> kept;  // --keep
  for (unsigned r = 0; r < request.repeat; ++r) {
    auto progress = std::make_shared<Progress>("loading " + printable(request.path));
    if (!request.json)
      options.load.progress = [progress](auto done, auto total) { progress->update(done, total); };
    FanoutLoad loaded = load_fanout(checkpoint, options);
    progress->finish();
    if (request.json) {
      runs.push_back(nlohmann::json::parse(to_json(loaded.stats())));
    } else {
      print_stats(report, loaded.stats(), request.tensor_parallel);
    }
    if (request.hash && r + 1 == request.repeat) print_digests(loaded);
    if (request.keep) kept.push_back(std::move(loaded));
  }
  if (request.json) (request.hash ? std::cerr : std::cout) << runs.dump(2) << "\n";
}

}  // namespace ferry::cli
