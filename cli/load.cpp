// ferry load PATH: loads a checkpoint into GPU or host memory and reports how it went.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <vector>

#include "commands.hpp"
#include "ferry/checkpoint.hpp"
#include "ferry/error.hpp"
#include "ferry/ggml_type.hpp"
#include "ferry/loaded_checkpoint.hpp"
#include "ferry/machine.hpp"
#include "ferry/tensor_digest.hpp"
#include "ferry/utf8_path.hpp"
#include "host_memory.hpp"
#include "load_command.hpp"
#include "load_fanout.hpp"
#include "progress.hpp"
#include "report.hpp"

namespace ferry::cli {

Device resolve_device(const std::string& text) {
  if (text != "auto") return Device::parse(text);
  if (cuda_available()) return Device::cuda(0);
  std::fprintf(stderr, "ferry: no usable GPU (%s): loading into host memory\n",
               cuda_facts().why_unusable.c_str());
  return Device::cpu();
}

void print_digests(const LoadedCheckpoint& loaded) {
  std::vector<const LoadedTensor*> sorted;
  for (const auto& t : loaded.tensors()) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const auto* a, const auto* b) { return a->info->name < b->info->name; });
  for (const auto* t : sorted) {
    // GGUF tensors say what GGUF says: the ggml type ("Q4_K") and dims ne[0] first, as
    // llama.cpp and the gguf package report them; the bytes hashed are the same either way.
    const TensorInfo& info = *t->info;
    const bool gguf = info.ggml_type >= 0;
    std::printf("%s\t%s\t%s\t%s\n", printable(info.name).c_str(),
                std::string(gguf ? ggml_type_name(info.ggml_type) : dtype_name(info.dtype)).c_str(),
                shape_text(gguf ? info.ggml_dims : info.shape).c_str(),
                digest_hex(tensor_digest(loaded, *t)).c_str());
  }
}

namespace {

volatile std::sig_atomic_t interrupted = 0;
extern "C" void on_interrupt(int) { interrupted = 1; }

}  // namespace

void add_load(CLI::App& app) {
  auto* cmd = app.add_subcommand("load", "Load a checkpoint into GPU or host memory");
  static std::string path;
  static std::string device = "auto";
  static std::string io = "auto";
  static std::string backend = "auto";
  static bool allow_compat = false;
  static bool hash = false;
  static bool json = false;
  static bool profile = false;
  static std::vector<std::string> names;
  // Engine settings stay text here: set_load_option, the one mapping every front end uses,
  // parses and checks them.
  static std::string staging_mib = std::to_string(kDefaultStagingBytes >> 20);
  static std::string chunk_mib = "0";
  static std::string threads = "0";
  static std::string slots = "0";
  static std::string copy_streams = "0";
  static std::string page_cache_pin = "0";
  static unsigned repeat = 1;
  static bool keep = false;
  static bool refill = false;
  static bool cache_device_memory = false;
  static bool tensor_parallel = false;
  static unsigned round_mib = 0;
  static std::string next_round = "eager";
  static std::string submissions = "per-round";
  cmd->add_option("path", path,
                  "a .safetensors or .gguf file, a directory of them, or an index .json")
      ->required();
  cmd->add_option("--device", device,
                  "cuda:N, cpu, or auto (the first GPU, else host memory); several, "
                  "comma-separated (cuda:0,cuda:1), load onto each at once, reading every byte "
                  "once")
      ->capture_default_str();
  cmd->add_flag("--tensor-parallel", tensor_parallel,
                "with several devices: each holds its tensor-parallel slices (as vLLM shards "
                "Llama/Qwen/Mistral) instead of a whole replica");
  cmd->add_option("--round-mib", round_mib,
                  "with several devices: each device's share of one all-gather round "
                  "(default: 256)")
      ->check(CLI::Range(0u, 65536u));
  cmd->add_option("--next-round", next_round,
                  "with several devices: when a round's reads start: eager (beside the previous "
                  "round's) or at-tail (as the previous round's last reads are handed out)")
      ->check(CLI::IsMember({"eager", "at-tail"}))
      ->capture_default_str();
  cmd->add_option("--submissions", submissions,
                  "with several devices: each round's reads in one submission with every "
                  "device's reader threads (per-round) or one per device with its own (per-device)")
      ->check(CLI::IsMember({"per-round", "per-device"}))
      ->capture_default_str();
  cmd->add_flag("--hash", hash,
                "print name, dtype, shape and XXH3-64 of each tensor as loaded, sorted by name "
                "(statistics then go to stderr); for GGUF the ggml type and dims, ne[0] first");
  cmd->add_flag("--json", json, "print the statistics as JSON");
  cmd->add_option("--tensor", names, "load only this tensor (repeatable)")->allow_extra_args(false);
  cmd->add_option("--io", io, "staged path: auto, direct (O_DIRECT) or buffered")
      ->capture_default_str();
  cmd->add_option("--backend", backend,
                  "auto (cuFile only where it does GPUDirect Storage), cufile, posix (staged) or "
                  "directstorage or dstorage (Windows)")
      ->capture_default_str();
  cmd->add_flag("--allow-compat", allow_compat,
                "let --backend cufile run in cuFile's compatibility mode, and --backend "
                "directstorage fall back to the staged path where DirectStorage cannot run");
  cmd->add_option("--staging-mib", staging_mib, "upper bound on host staging memory")
      ->capture_default_str();
  cmd->add_option("--chunk-mib", chunk_mib,
                  "largest read into one staging slot (default: chosen; O_DIRECT moves it in calls "
                  "of at most 1 MiB)");
  cmd->add_option("--threads", threads, "reader threads (default: chosen)");
  cmd->add_option("--slots", slots, "staging slots per reader thread (default: chosen)");
  cmd->add_option("--copy-streams", copy_streams,
                  "CUDA streams the reader threads' copies share (default: one per thread)");
  cmd->add_option("--page-cache-pin", page_cache_pin,
                  "page-cache DMA (Linux, GPU): keep up to this many bytes of files that are "
                  "wholly in the page cache registered with the GPU driver, and copy them straight "
                  "from there (4GiB, 1.5GiB, bytes; default 0: off); the first load registers, "
                  "later ones in the process reuse (see --repeat)")
      ->capture_default_str();
  cmd->add_flag("--profile", profile,
                "time the copies on the GPU for the statistics (copy engine busy time; costs a "
                "little)");
  cmd->add_option("--repeat", repeat,
                  "load this many times and report each (by default each load's memory is freed "
                  "right before the next load: the driver's work after freeing it slows the next "
                  "load's first copies)")
      ->check(CLI::Range(1u, 1000000u));
  auto* keep_flag = cmd->add_flag("--keep", keep,
                                  "with --repeat: hold every load's memory to the end (a server "
                                  "loading another model while the first stays resident)");
  cmd->add_flag("--refill", refill,
                "with --repeat: load the second and later times into the first load's memory "
                "(load_into its tensors, as a weight refresh does); one device only")
      ->excludes(keep_flag);
  cmd->add_flag("--cache-device-memory", cache_device_memory,
                "GPU: take each load's memory from a process-wide cache that keeps what loads "
                "free for later ones (no driver work after a free slowing the next load's "
                "copies); it holds freed GPU memory from other allocators, so it is off by "
                "default");
  cmd->callback([] {
    LoadOptions options;
    const bool several = lists_several_devices(device);
    options.device = several ? Device::cpu() : resolve_device(device);
    options.names = names;
    set_load_option(options, "io", io);
    set_load_option(options, "backend", backend);
    set_load_option(options, "allow_compat", allow_compat ? "true" : "false");
    set_load_option(options, "staging_bytes", staging_mib + "MiB");
    set_load_option(options, "chunk_bytes", chunk_mib + "MiB");
    set_load_option(options, "threads", threads);
    set_load_option(options, "slots", slots);
    set_load_option(options, "copy_streams", copy_streams);
    set_load_option(options, "profile", profile ? "true" : "false");
    set_load_option(options, "page_cache_pin", page_cache_pin);
    set_load_option(options, "cache_device_memory", cache_device_memory ? "true" : "false");
    // Ctrl-C stops the load between chunks (it throws ferry::Cancelled: exit status 130).
#ifdef _WIN32
    std::signal(SIGINT, on_interrupt);  // the C runtime's Ctrl-C handler (no sigaction there)
#else
    struct sigaction on_int {};
    on_int.sa_handler = on_interrupt;
    ::sigaction(SIGINT, &on_int, nullptr);
#endif
    options.keep_going = [] { return interrupted == 0; };
    if (several) {
      FERRY_EXPECT(!refill, std::invalid_argument,
                   "--refill loads into the first load's memory on one device: not with several "
                   "devices (--device ", device, ")");
      FERRY_EXPECT(!cache_device_memory, std::invalid_argument,
                   "--cache-device-memory serves loads onto one device: not with several devices "
                   "(--device ", device, ")");
      return run_fanout_load({path, device, options, tensor_parallel, hash, json, repeat,
                              std::uint64_t{round_mib} << 20, next_round == "at-tail",
                              submissions == "per-device", keep});
    }
    FERRY_EXPECT(!tensor_parallel, std::invalid_argument,
                 "--tensor-parallel needs several devices (--device cuda:0,cuda:1)");
    auto checkpoint = Checkpoint::open_shared(path_from_utf8(path));
    // CUDA start-up is held outside the measured loads, as in a server that already runs.
    prepare_device(options.device);
    std::FILE* report = hash ? stderr : stdout;
    nlohmann::json runs = nlohmann::json::array();
    std::vector<LoadedCheckpoint> kept;        // --keep: every load; --refill: the first
    std::vector<TensorDestination> refill_to;  // --refill: the first load's tensors
    for (unsigned r = 0; r < repeat; ++r) {
      auto progress = std::make_shared<Progress>("loading " + printable(path));
      if (!json)
        options.progress = [progress](auto done, auto total) { progress->update(done, total); };
      const bool peak_known = reset_peak_resident();
      const std::uint64_t before = resident_bytes();
      const bool refilling = refill && r > 0;
      // Without --keep or --refill the previous load is freed here, right before this one.
      std::optional<LoadedCheckpoint> loaded;
      LoadStats stats;
      // The whole call: the load's own clock starts after the device context and the tuning
      // lookup, which a caller pays too.
      const auto called = std::chrono::steady_clock::now();
      if (refilling) {
        stats = load_into(*checkpoint, refill_to, options);
      } else {
        loaded.emplace(load(checkpoint, options));
        stats = loaded->stats();
      }
      const double call_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - called).count();
      progress->finish();
      // Host memory the load added beyond its destination (which is host memory on cpu).
      const std::uint64_t destination = options.device.is_cuda() ? 0 : stats.allocated_bytes;
      const std::uint64_t peak = peak_known ? peak_resident_bytes() : resident_bytes();
      const std::uint64_t growth = peak > before + destination ? peak - before - destination : 0;
      const std::size_t tensors = refilling ? refill_to.size() : loaded->tensors().size();
      if (json) {
        runs.push_back(stats_json(stats));
        runs.back()["peak_host_growth_bytes"] = growth;
        runs.back()["into"] = refilling ? "first load's memory" : "new memory";
        runs.back()["loads_held"] = kept.size();  // earlier loads resident during this one
        runs.back()["call_seconds"] = call_seconds;
      } else {
        print_stats(report, stats, tensors);
        std::fprintf(report, "host memory: peak growth %s beyond the destination\n",
                     human_bytes(growth).c_str());
      }
      if (hash && r + 1 == repeat) print_digests(refilling ? kept.front() : *loaded);
      if (loaded && (keep || (refill && r == 0))) {
        if (refill)
          for (const LoadedTensor& t : loaded->tensors())
            refill_to.push_back({t.info->name, t.data, t.info->size});
        kept.push_back(std::move(*loaded));
      }
    }
    if (json) (hash ? std::cerr : std::cout) << runs.dump(2) << "\n";
  });
}

}  // namespace ferry::cli
