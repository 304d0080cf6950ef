// ferry load PATH: loads a checkpoint into GPU or host memory and reports how it went.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "ferry/checkpoint.hpp"
#include "ferry/loaded_checkpoint.hpp"
#include "ferry/tensor_digest.hpp"
#include "load_command.hpp"
#include "progress.hpp"
#include "report.hpp"
#include "shim/cuda_driver.hpp"

namespace ferry::cli {

Device resolve_device(const std::string& text) {
  if (text != "auto") return Device::parse(text);
  if (cuda_available()) return Device::cuda(0);
  std::fprintf(stderr, "ferry: no usable GPU (%s): loading into host memory\n",
               shim::CudaDriver::get().why_unusable.c_str());
  return Device::cpu();
}

void print_digests(const LoadedCheckpoint& loaded) {
  std::vector<const LoadedTensor*> sorted;
  for (const auto& t : loaded.tensors()) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const auto* a, const auto* b) { return a->info->name < b->info->name; });
  for (const auto* t : sorted)
    std::printf("%s\t%s\t%s\t%s\n", t->info->name.c_str(),
                std::string(dtype_name(t->info->dtype)).c_str(), shape_text(t->info->shape).c_str(),
                digest_hex(tensor_digest(loaded, *t)).c_str());
}

void add_load(CLI::App& app) {
  auto* cmd = app.add_subcommand("load", "Load a checkpoint into GPU or host memory");
  static std::string path;
  static std::string device = "auto";
  static std::string io = "auto";
  static bool hash = false;
  static bool json = false;
  static std::vector<std::string> names;
  static double staging_mib = static_cast<double>(kDefaultStagingBytes >> 20);
  static double chunk_mib = 0;
  static unsigned threads = 0;
  static unsigned repeat = 1;
  cmd->add_option("path", path, "a .safetensors file, a shard directory or an index .json")
      ->required();
  cmd->add_option("--device", device, "cuda:N, cpu, or auto (the first GPU, else host memory)")
      ->capture_default_str();
  cmd->add_flag("--hash", hash,
                "print name, dtype, shape and XXH3-64 of each tensor as loaded, sorted by name "
                "(statistics then go to stderr)");
  cmd->add_flag("--json", json, "print the statistics as JSON");
  cmd->add_option("--tensor", names, "load only this tensor (repeatable)");
  cmd->add_option("--io", io, "auto, direct (O_DIRECT) or buffered")->capture_default_str();
  cmd->add_option("--staging-mib", staging_mib, "upper bound on host staging memory")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--chunk-mib", chunk_mib, "largest single read (default: chosen)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--threads", threads, "reader threads (default: chosen)");
  cmd->add_option("--repeat", repeat, "load this many times and report each")
      ->check(CLI::PositiveNumber);
  cmd->callback([] {
    auto checkpoint = std::make_shared<const Checkpoint>(Checkpoint::open(path));
    LoadOptions options;
    options.device = resolve_device(device);
    options.io = parse_io_mode(io);
    options.names = names;
    options.staging_bytes = static_cast<std::uint64_t>(staging_mib * (1 << 20));
    options.chunk_bytes = static_cast<std::uint64_t>(chunk_mib * (1 << 20));
    options.reader_threads = threads;
    std::FILE* report = hash ? stderr : stdout;
    nlohmann::json runs = nlohmann::json::array();
    for (unsigned r = 0; r < repeat; ++r) {
      auto progress = std::make_shared<Progress>("loading " + path);
      if (!json) options.progress = [progress](auto done, auto total) { progress->update(done, total); };
      LoadedCheckpoint loaded = load(checkpoint, options);
      progress->finish();
      if (json)
        runs.push_back(stats_json(loaded.stats()));
      else
        print_stats(report, loaded.stats(), loaded.tensors().size());
      if (hash && r + 1 == repeat) print_digests(loaded);
    }
    if (json) (hash ? std::cerr : std::cout) << runs.dump(2) << "\n";
  });
}

}  // namespace ferry::cli
