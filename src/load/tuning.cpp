#include "ferry/tuning.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <system_error>
#include <thread>
#include <vector>

#include "ferry/error.hpp"
#include "ferry/loaded_checkpoint.hpp"
#include "platform/file_descriptor.hpp"
#include "platform/file.hpp"
#include "platform/system.hpp"
#include "shim/cuda_driver.hpp"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr std::uint64_t kMiB = 1ull << 20;

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  const std::tm utc = detail::utc_time(now);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

std::string gpu0_name() {
  const auto& d = shim::CudaDriver::get();
  if (!d.usable || d.device_count < 1) return "no GPU";
  shim::cu::Device device = 0;
  char name[256] = {};
  if (d.cuDeviceGet(&device, 0) != 0 || d.cuDeviceGetName(name, sizeof name, device) != 0)
    return "GPU 0 unnamed";
  return name;
}

// A tuning file is a few hundred bytes.
constexpr std::uint64_t kMaxTuningFileBytes = 1 << 20;

[[noreturn]] void malformed(const fs::path& file, const std::string& why) {
  detail::fail<FormatError>(file.string(), ": not a usable ferry tuning file (", why,
                            "); delete it, or measure again with `ferry doctor "
                            "CHECKPOINT --tune`");
}

std::uint64_t staging_of(const Tuning& t) {
  return std::uint64_t{t.reader_threads} * t.slots_per_thread * t.chunk_bytes;
}

}  // namespace

fs::path tuning_file() {
  if (const char* explicit_file = std::getenv("FERRY_TUNING_FILE"); explicit_file && *explicit_file)
    return explicit_file;
  return detail::user_cache_directory() / "ferry" / "tuning.json";
}

std::string this_machine() {
  static const std::string machine =
      std::to_string(std::max(1u, std::thread::hardware_concurrency())) + " cores, " + gpu0_name();
  return machine;
}

std::optional<Tuning> read_tuning(const fs::path& file) {
  // Opened without blocking and checked before reading: a FIFO there would hang every load.
  detail::FileDescriptor fd;
  try {
    fd = detail::open_for_reading(file);
  } catch (const std::system_error& e) {
    if (e.code() == std::errc::no_such_file_or_directory || e.code() == std::errc::not_a_directory)
      return std::nullopt;
    detail::fail_errno(e.code().value(), file.string(), ": cannot read the tuning file");
  }
  const std::uint64_t size = detail::file_size(fd, file);  // refuses all but regular files
  if (size > kMaxTuningFileBytes)
    malformed(file,
              detail::concat(size, " bytes; a tuning file holds less than ", kMaxTuningFileBytes));
  std::string text(size, '\0');
  detail::read_exact(fd, text.data(), size, 0, file);
  Json j;
  try {
    j = Json::parse(text);
    Tuning t;
    t.reader_threads = j.at("reader_threads").get<unsigned>();
    t.chunk_bytes = j.at("chunk_bytes").get<std::uint64_t>();
    t.slots_per_thread = j.at("slots_per_thread").get<unsigned>();
    t.machine = j.at("machine").get<std::string>();
    t.measured = j.value("measured", "");
    t.gigabytes_per_second = j.value("gigabytes_per_second", 0.0);
    t.checkpoint = j.value("checkpoint", "");
    if (t.reader_threads < 1 || t.reader_threads > 1024)
      malformed(file, "reader_threads must be 1 to 1024");
    if (t.chunk_bytes < 4096 || t.chunk_bytes % 4096 || t.chunk_bytes > (1ull << 30))
      malformed(file, "chunk_bytes must be a multiple of 4096 up to 1 GiB");
    if (t.slots_per_thread < 1 || t.slots_per_thread > 16)
      malformed(file, "slots_per_thread must be 1 to 16");
    return t;
  } catch (const nlohmann::json::exception& e) {
    malformed(file, e.what());
  }
}

void write_tuning(const fs::path& file, const Tuning& t) {
  fs::create_directories(file.parent_path());
  const Json j = {{"reader_threads", t.reader_threads},
                  {"chunk_bytes", t.chunk_bytes},
                  {"slots_per_thread", t.slots_per_thread},
                  {"machine", t.machine},
                  {"measured", t.measured},
                  {"gigabytes_per_second", t.gigabytes_per_second},
                  {"checkpoint", t.checkpoint}};
  // Written aside and renamed, so that a concurrent load never reads half a file.
  const fs::path partial = file.string() + ".partial." + std::to_string(detail::process_id());
  {
    std::ofstream out(partial, std::ios::binary);
    out << j.dump(2) << "\n";
    FERRY_EXPECT(out.good(), std::runtime_error, partial.string(),
                 ": cannot write the tuning file");
  }
  fs::rename(partial, file);
}

namespace {

// What a tuning file was when it was last read: a server's loads read an unchanged file once.
struct TuningFileState {
  fs::path path;
  detail::FileIdentity identity;  // device, inode, size, mtime
  bool operator==(const TuningFileState& other) const {
    return path == other.path && identity.same_contents(other.identity);
  }
};

// The file's state, or nullopt where it is not a regular file (those are read, never kept).
std::optional<TuningFileState> tuning_file_state(const fs::path& file) {
  const std::optional<detail::FileIdentity> identity = detail::identity_at(file);
  if (!identity) return std::nullopt;
  return TuningFileState{file, *identity};
}

ActiveTuning read_active_tuning(const fs::path& file);

}  // namespace

ActiveTuning active_tuning() {
  static std::mutex mutex;
  static std::optional<std::pair<TuningFileState, ActiveTuning>> kept;
  const fs::path file = tuning_file();
  const std::optional<TuningFileState> state = tuning_file_state(file);
  {
    std::lock_guard lock(mutex);
    if (state && kept && kept->first == *state) return kept->second;
  }
  ActiveTuning active = read_active_tuning(file);
  if (state) {
    std::lock_guard lock(mutex);
    kept.emplace(*state, active);
  }
  return active;
}

namespace {

ActiveTuning read_active_tuning(const fs::path& file) {
  std::optional<Tuning> t;
  // An unusable tuning location never stops a load: the defaults apply and say why.
  try {
    t = read_tuning(file);
  } catch (const std::exception& e) {
    return {std::nullopt, std::string("built-in defaults (") + e.what() + ")"};
  }
  if (!t)
    return {std::nullopt, "built-in defaults (no tuning file at " + file.string() +
                              "; `ferry doctor CHECKPOINT --tune` measures one)"};
  if (t->machine != this_machine())
    return {std::nullopt, "built-in defaults (" + file.string() + " was measured on " + t->machine +
                              ", this is " + this_machine() + ")"};
  std::ostringstream source;
  source.precision(3);
  source << "measured by ferry doctor --tune on " << t->measured << " (" << t->gigabytes_per_second
         << " GB/s), " << file.string();
  return {t, source.str()};
}

}  // namespace

Tuning tune(const std::shared_ptr<const Checkpoint>& checkpoint, const Device& device,
            unsigned runs, const std::function<void(const Tuning&)>& report) {
  FERRY_EXPECT(checkpoint != nullptr, std::invalid_argument, "tune: no checkpoint given");
  FERRY_EXPECT(runs >= 1, std::invalid_argument, "tune: runs must be at least 1");
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::vector<unsigned> threads;
  for (unsigned t : {8u, 12u, 16u})
    if (t <= cores) threads.push_back(t);
  if (threads.empty()) threads.push_back(cores);
  std::vector<Tuning> measured;
  for (unsigned t : threads) {
    for (std::uint64_t chunk : {2 * kMiB, 4 * kMiB, 8 * kMiB}) {
      for (unsigned slots : {2u, 3u}) {
        LoadOptions options;
        options.device = device;
        options.reader_threads = t;
        options.chunk_bytes = chunk;
        options.slots_per_thread = slots;
        options.staging_bytes = std::uint64_t{t} * slots * (chunk + 2 * 4096);
        std::vector<double> rates;
        for (unsigned r = 0; r <= runs; ++r) {
          const double gbps = load(checkpoint, options).stats().gigabytes_per_second();
          if (r > 0) rates.push_back(gbps);  // the first load warms caches and staging
        }
        std::sort(rates.begin(), rates.end());
        measured.push_back({t, chunk, slots, this_machine(), utc_now(), rates[rates.size() / 2],
                            checkpoint->files().front().path.string()});
        if (report) report(measured.back());
      }
    }
  }
  // Within 2% of the fastest (run-to-run noise), the most reader threads win, then the
  // smallest staging: tuning sees a warm page cache, and the same settings must also serve
  // tmpfs, where fewer threads fell 25% short on an H200 host while they tied in the page cache.
  double fastest = 0;
  for (const auto& m : measured) fastest = std::max(fastest, m.gigabytes_per_second);
  const Tuning* best = nullptr;
  const auto better = [](const Tuning& a, const Tuning& b) {
    if (a.reader_threads != b.reader_threads) return a.reader_threads > b.reader_threads;
    if (staging_of(a) != staging_of(b)) return staging_of(a) < staging_of(b);
    return a.gigabytes_per_second > b.gigabytes_per_second;
  };
  for (const auto& m : measured)
    if (m.gigabytes_per_second >= 0.98 * fastest && (!best || better(m, *best))) best = &m;
  return *best;
}

}  // namespace ferry
