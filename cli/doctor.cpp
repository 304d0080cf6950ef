// ferry doctor [PATH]: what this machine offers for loading, measured rather than assumed.

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "commands.hpp"
#include "ferry/error.hpp"
#include "ferry/loaded_checkpoint.hpp"
#include "ferry/machine.hpp"
#include "ferry/tuning.hpp"
#include "ferry/utf8_path.hpp"
#include "report.hpp"

namespace ferry::cli {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr std::uint64_t kCopyProbeBytes = 256ull << 20;

std::vector<fs::path> files_under(const fs::path& path) {
  std::vector<fs::path> files;
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec || !fs::exists(status)) detail::fail_errno(ENOENT, utf8_of(path));
  if (fs::is_regular_file(status)) return {path};
  FERRY_EXPECT(fs::is_directory(status), std::invalid_argument, utf8_of(path),
               ": not a regular file or a directory (doctor measures reads of files)");
  for (const auto& e : fs::directory_iterator(path))
    if (e.is_regular_file() && e.file_size() > 0) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

Json cuda_section() {
  const CudaFacts facts = cuda_facts();
  Json cuda = {{"usable", facts.usable}};
  if (!facts.usable) {
    cuda["why_not"] = facts.why_unusable;
    return cuda;
  }
  cuda["driver_version"] = std::to_string(facts.driver_version / 1000) + "." +
                           std::to_string(facts.driver_version % 1000 / 10);
  Json gpus = Json::array();
  for (const auto& g : facts.gpus)
    gpus.push_back({{"index", g.index},
                    {"name", g.name},
                    {"memory_bytes", g.memory_bytes},
                    {"pci_bus", g.pci_bus}});
  cuda["gpus"] = gpus;
  const auto bw = measure_host_to_device(0, kCopyProbeBytes, 5);
  cuda["host_to_device_gbps"] = {{"pinned", bw.pinned_gbps},
                                 {"pageable", bw.pageable_gbps},
                                 {"copy_bytes", kCopyProbeBytes},
                                 {"device", "cuda:0"}};
  return cuda;
}

Json cufile_section(const std::string& path) {
  const CufileFacts f = cufile_facts(path_from_utf8(path));
  Json out = {{"library_loaded", f.library_loaded},
              {"driver_opened", f.driver_opened},
              {"nvidia_fs_loaded", f.nvidia_fs_loaded},
              {"compat_allowed", f.compat_allowed},
              {"compat_forced", f.compat_forced},
              {"version", f.version},
              {"mode", f.mode},
              {"reason", f.reason}};
  if (!f.path_mode.empty()) {
    out["path_mode"] = f.path_mode;
    out["path_reason"] = f.path_reason;
  }
  return out;
}

Json path_section(const fs::path& path, std::uint64_t read_limit, unsigned threads) {
  Json out = {{"path", utf8_of(path)}, {"filesystem", filesystem_name(path)}};
  auto files = files_under(path);
  // BypassIO is asked of a file (the first one read below) where there is one.
  const StorageFacts storage = storage_facts(files.empty() ? path : files.front());
  out["storage"] = {{"nvme", storage.nvme}};
  if (!storage.bypass_io.empty()) out["storage"]["bypass_io"] = storage.bypass_io;
  if (files.empty()) {
    out["note"] = "no files to read under this path";
    return out;
  }
  std::uint64_t bytes = 0;
  double cached = 0;
  const bool residency = page_cache_residency_measured();
  for (const auto& f : files) {
    const auto size = fs::file_size(f);
    if (residency) cached += page_cache_fraction(f) * static_cast<double>(size);
    bytes += size;
  }
  out["files"] = files.size();
  out["bytes"] = bytes;
  if (residency)
    out["page_cache_fraction"] = bytes ? cached / static_cast<double>(bytes) : 1.0;
  else
    out["page_cache_fraction"] = nullptr;  // unknown, not 0
  const auto direct = probe_direct(files.front());
  out["odirect"] = {{"works", direct.works}, {"detail", direct.detail}, {"flag", direct.flag}};
  // O_DIRECT first: it leaves the page cache as it was, so the buffered figure that follows
  // reads whatever was cached before plus what buffered reading itself brings in.
  Json reads = {{"threads", threads}, {"limit_bytes", read_limit}};
  if (direct.works)
    reads["odirect_gbps"] = measure_read(files, IoMode::Direct, threads, read_limit);
  reads["buffered_gbps"] = measure_read(files, IoMode::Buffered, threads, read_limit);
  out["read"] = reads;
  return out;
}

// Measures every candidate setting on the checkpoint at `path` and writes the winner to the
// tuning file. Progress goes to stderr, so that --json output stays one document.
void tune(const std::string& path, bool json) {
  FERRY_EXPECT(!path.empty(), std::invalid_argument, "doctor --tune needs a checkpoint PATH");
  auto checkpoint = Checkpoint::open_shared(path_from_utf8(path));
  const Device device = cuda_available() ? Device::cuda(0) : Device::cpu();
  std::FILE* out = json ? stderr : stdout;
  std::fprintf(out, "tuning on %s (%s, warm page cache), to %s; 3 loads per setting after one:\n",
               printable(path).c_str(), human_bytes(checkpoint->total_bytes()).c_str(),
               device.to_string().c_str());
  const Tuning best = ferry::tune(checkpoint, device, 3, [out](const Tuning& t) {
    std::fprintf(out, "  %2u threads, %s reads, %u slots: %.2f GB/s\n", t.reader_threads,
                 human_bytes(t.chunk_bytes).c_str(), t.slots_per_thread, t.gigabytes_per_second);
    std::fflush(out);
  });
  write_tuning(tuning_file(), best);
  std::fprintf(out,
               "chose %u threads, %s reads, %u slots (%.2f GB/s; within 2%% of the fastest, the "
               "most threads, then the smallest staging); written to %s\n",
               best.reader_threads, human_bytes(best.chunk_bytes).c_str(), best.slots_per_thread,
               best.gigabytes_per_second, printable(tuning_file().string()).c_str());
}

void print_text(const Json& r) {
  std::printf("machine: %d cores, %s memory\n", r["cores"].get<int>(),
              human_bytes(r["memory_bytes"].get<std::uint64_t>()).c_str());
  const Json& c = r["cuda"];
  if (!c["usable"].get<bool>()) {
    std::printf("cuda: not usable: %s\n  loads go to host memory (--device cpu)\n",
                c["why_not"].get<std::string>().c_str());
  } else {
    std::printf("cuda: driver %s\n", c["driver_version"].get<std::string>().c_str());
    for (const auto& g : c["gpus"])
      std::printf("  cuda:%d %s, %s, PCI bus %d\n", g["index"].get<int>(),
                  g["name"].get<std::string>().c_str(),
                  human_bytes(g["memory_bytes"].get<std::uint64_t>()).c_str(),
                  g["pci_bus"].get<int>());
    const Json& bw = c["host_to_device_gbps"];
    std::printf(
        "  host->cuda:0 copy (256 MiB, median of 5): pinned %.1f GB/s, pageable %.1f GB/s\n",
        bw["pinned"].get<double>(), bw["pageable"].get<double>());
  }
  const Json& g = r["cufile"];
  std::printf("cuFile: %s (%s)\n", g["mode"].get<std::string>().c_str(),
              g["reason"].get<std::string>().c_str());
  if (g.contains("path_mode"))
    std::printf("  for PATH: %s (%s)\n", g["path_mode"].get<std::string>().c_str(),
                g["path_reason"].get<std::string>().c_str());
  std::printf(
      "  --backend auto takes cuFile only where it does GPUDirect Storage: %s\n",
      g.value("path_mode", g["mode"].get<std::string>()) == "gds" ? "it would here" : "not here");
  const Json& ds = r["directstorage"];
  std::printf("DirectStorage: %s (%s)\n  --backend directstorage %s\n",
              ds["available"].get<bool>() ? "available" : "not available",
              printable(ds["reason"].get<std::string>()).c_str(),
              ds["available"].get<bool>()
                  ? "reads through it (cuda:N: into a D3D12 buffer shared with CUDA; cpu: into "
                    "host staging); auto never chooses it"
                  : "fails here unless --allow-compat lets the staged path stand in");
  if (ds.contains("cuda0_adapter"))
    std::printf("  D3D12 adapter of cuda:0: %s\n",
                printable(ds["cuda0_adapter"].get<std::string>()).c_str());
  if (ds.contains("cuda0_bridge"))
    std::printf("  DirectStorage into cuda:0: %s\n",
                printable(ds["cuda0_bridge"].get<std::string>()).c_str());
  const Json& n = r["nccl"];
  if (n["loaded"].get<bool>()) {
    const int v = n["version"].get<int>();
    std::printf("NCCL: %d.%d.%d from %s (multi-GPU loads: --device cuda:0,cuda:1)\n", v / 10000,
                v / 100 % 100, v % 100, printable(n["path"].get<std::string>()).c_str());
  } else {
    std::printf("NCCL: not found (%s)\n",
                printable(n["why_not_loaded"].get<std::string>()).c_str());
  }
  const Json& e = r["engine"];
  std::printf(
      "engine: %u reader threads, %s reads, %u slots each, staging bound %s\n"
      "  settings: %s\n  %s\n",
      e["reader_threads"].get<unsigned>(),
      human_bytes(e["chunk_bytes"].get<std::uint64_t>()).c_str(),
      e["slots_per_thread"].get<unsigned>(),
      human_bytes(e["staging_bytes"].get<std::uint64_t>()).c_str(),
      printable(e["settings_source"].get<std::string>()).c_str(),
      e["io_auto"].get<std::string>().c_str());
  if (!r.contains("path")) return;
  const Json& p = r["path"];
  std::printf("path: %s\n  file system: %s\n", printable(p["path"].get<std::string>()).c_str(),
              p["filesystem"].get<std::string>().c_str());
  const Json& s = p["storage"];
  std::printf("  NVMe: %s\n", printable(s["nvme"].get<std::string>()).c_str());
  if (s.contains("bypass_io"))
    std::printf("  BypassIO: %s\n", printable(s["bypass_io"].get<std::string>()).c_str());
  if (p.contains("note")) {
    std::printf("  %s\n", p["note"].get<std::string>().c_str());
    return;
  }
  std::printf("  %zu file(s), %s, ", p["files"].get<std::size_t>(),
              human_bytes(p["bytes"].get<std::uint64_t>()).c_str());
  if (p["page_cache_fraction"].is_null())
    std::printf("page-cache residency unknown (this system cannot report it)\n");
  else
    std::printf("%.0f%% in page cache before measuring\n",
                p["page_cache_fraction"].get<double>() * 100);
  const std::string flag = p["odirect"]["flag"].get<std::string>();
  std::printf("  %s: %s (%s)\n", flag.c_str(), p["odirect"]["works"].get<bool>() ? "yes" : "no",
              printable(p["odirect"]["detail"].get<std::string>()).c_str());
  const Json& rd = p["read"];
  if (rd.contains("odirect_gbps"))
    std::printf("  read, %s: %.2f GB/s\n", flag.c_str(), rd["odirect_gbps"].get<double>());
  std::printf("  read, buffered: %.2f GB/s\n", rd["buffered_gbps"].get<double>());
}

}  // namespace

void add_doctor(CLI::App& app) {
  auto* cmd = app.add_subcommand("doctor",
                                 "Show and measure what this machine offers: GPUs, driver, copy "
                                 "bandwidth, file system, NVMe, BypassIO (Windows), unbuffered "
                                 "reads");
  static std::string path;
  static bool json = false;
  static double read_limit_gib = 4;
  static bool tune_engine = false;
  cmd->add_option("path", path, "a file or directory whose file system and reads to measure");
  cmd->add_flag("--json", json, "print JSON");
  cmd->add_option("--read-limit-gib", read_limit_gib, "read at most this much of PATH per mode")
      ->check(finite_between(1.0 / 1024, 1 << 20))
      ->capture_default_str();
  cmd->add_flag("--tune", tune_engine,
                "load the checkpoint at PATH with each candidate engine setting (to cuda:0, else "
                "host memory), keep the fastest in the tuning file that later loads read");
  cmd->callback([] {
    Json report;
    report["cores"] = std::thread::hardware_concurrency();
    report["memory_bytes"] = physical_memory_bytes();
    report["cuda"] = cuda_section();
    report["cufile"] = cufile_section(path);
    const DirectStorageFacts ds = directstorage_facts();
    report["directstorage"] = {{"available", ds.available}, {"reason", ds.reason}};
    if (!ds.cuda0_adapter.empty()) report["directstorage"]["cuda0_adapter"] = ds.cuda0_adapter;
    if (!ds.cuda0_bridge.empty()) report["directstorage"]["cuda0_bridge"] = ds.cuda0_bridge;
    const NcclFacts nccl = nccl_facts();
    report["nccl"] = {{"loaded", nccl.loaded},
                      {"path", nccl.path},
                      {"why_not_loaded", nccl.why_not_loaded},
                      {"version", nccl.version}};
    if (tune_engine) tune(path, json);
    const auto engine = default_engine_settings();
    report["engine"] = {{"reader_threads", engine.reader_threads},
                        {"chunk_bytes", engine.chunk_bytes},
                        {"slots_per_thread", engine.slots_per_thread},
                        {"settings_source", engine.source},
                        {"staging_bytes", kDefaultStagingBytes},
                        {"io_auto", page_cache_residency_measured()
                                        ? "O_DIRECT or buffered: chosen per file at each load "
                                          "from its page-cache residency"
                                        : "unbuffered or buffered: --io auto reads unbuffered "
                                          "wherever the file system allows (this system cannot "
                                          "report page-cache residency)"}};
    if (!path.empty())
      report["path"] = path_section(path_from_utf8(path),
                                    static_cast<std::uint64_t>(read_limit_gib * (1ull << 30)),
                                    engine.reader_threads);
    if (json)
      std::cout << report.dump(2, ' ', false, Json::error_handler_t::replace) << "\n";
    else
      print_text(report);
  });
}

}  // namespace ferry::cli
