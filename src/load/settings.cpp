#include "load/settings.hpp"

#include <algorithm>
#include <thread>

#include "ferry/error.hpp"
#include "platform/file.hpp"
#include "services/worker_pool.hpp"

namespace ferry::detail {
namespace {

// Defaults where no tuning file applies, measured on an H200 host (16 cores, warm page cache and
// tmpfs, the grid `ferry doctor --tune` runs): 4 MiB reads, two slots a thread and 16 threads
// load fastest (47 GB/s against 45 with 2 MiB, whose copies run at 51 GB/s instead of 53; fewer
// threads tie in the page cache but fall behind on tmpfs); 8 MiB and deeper queues lose more to
// cache misses and pinning.
constexpr std::uint64_t kDefaultChunk = 4ull << 20;
constexpr std::uint64_t kMinChunk = 256ull << 10;
constexpr unsigned kMaxDefaultThreads = 16;
// Room for the unaligned head and the rounded-up tail of an O_DIRECT read.
constexpr std::uint64_t kSlotSlack = 2 * kDirectAlignment;

std::uint64_t slot_bytes(std::uint64_t chunk) {
  return (chunk + kSlotSlack + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
}

}  // namespace

ActiveTuning tuning_for(const LoadOptions& options) {
  const bool all_given = options.reader_threads && options.chunk_bytes && options.slots_per_thread;
  return all_given ? ActiveTuning{std::nullopt, "given by the caller"} : active_tuning();
}

EngineSettings choose_settings(const LoadOptions& options) {
  return choose_settings(options, tuning_for(options));
}

EngineSettings choose_settings(const LoadOptions& options, const ActiveTuning& active) {
  EngineSettings s;
  // hardware_concurrency() reads /sys on each call: once per process is enough.
  static const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  // Whatever the caller leaves at zero comes from this machine's tuning file, else the defaults.
  const std::optional<Tuning>& tuned = active.tuning;
  s.source = active.source;
  s.threads = options.reader_threads ? options.reader_threads
              : tuned                ? tuned->reader_threads
                                     : std::min(cores, kMaxDefaultThreads);
  if (s.threads > kMaxWorkerThreads) {
    s.source +=
        "; " + std::to_string(s.threads) + " threads cut to " + std::to_string(kMaxWorkerThreads);
    s.threads = kMaxWorkerThreads;
  }
  if (options.slots_per_thread)
    s.slots_per_thread = options.slots_per_thread;
  else if (tuned)
    s.slots_per_thread = tuned->slots_per_thread;
  const std::uint64_t staging = options.staging_bytes;
  const auto fits = [&] {
    return std::uint64_t{s.slots_per_thread} * s.threads * slot_bytes(s.chunk_bytes) <= staging;
  };
  const std::uint64_t wanted_chunk = tuned ? tuned->chunk_bytes : kDefaultChunk;
  if (options.chunk_bytes) {
    s.chunk_bytes =
        (options.chunk_bytes + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
  } else {
    s.chunk_bytes = wanted_chunk;
    while (!fits() && s.chunk_bytes > kMinChunk) s.chunk_bytes /= 2;
  }
  // Fewer threads where the budget cannot give each of them its slots.
  const unsigned wanted_threads = s.threads;
  while (s.threads > 1 && !fits()) --s.threads;
  FERRY_EXPECT(fits(), std::invalid_argument, "staging of ", staging, " bytes cannot hold ",
               s.slots_per_thread, " slots of ", s.chunk_bytes, "-byte reads");
  if (s.threads < wanted_threads || (!options.chunk_bytes && s.chunk_bytes < wanted_chunk))
    s.source += "; cut to " + std::to_string(s.threads) + " threads of " +
                std::to_string(s.chunk_bytes) + "-byte reads to fit the staging bound of " +
                std::to_string(staging) + " bytes";
  return s;
}

TransferOptions staging_options(const EngineSettings& settings, const LoadOptions& options) {
  TransferOptions t;
  t.threads = settings.threads;
  t.chunk_bytes = settings.chunk_bytes;
  t.slots_per_thread = settings.slots_per_thread;
  t.staging_bytes = options.staging_bytes;
  t.copy_streams = options.copy_streams;
  t.page_cache_pin_bytes = options.page_cache_pin_bytes;
  return t;
}

}  // namespace ferry::detail
