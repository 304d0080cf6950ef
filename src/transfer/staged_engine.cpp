#include "transfer/staged_engine.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "cuda/cuda_resources.hpp"
#include "transfer/staging_cache.hpp"
#include "ferry/error.hpp"
#include "ferry/tuning.hpp"
#include "io/source_file.hpp"

namespace ferry::detail {
namespace {

// Defaults where no tuning file applies, measured on an H200 host (16 cores, warm page cache and
// tmpfs, the grid `ferry doctor --tune` runs): 4 MiB reads, two slots a thread and 16 threads
// load fastest (47 GB/s against 45 with 2 MiB, whose copies run at 51 GB/s instead of 53; fewer
// threads tie in the page cache but fall behind on tmpfs); 8 MiB and deeper queues lose more to
// cache misses and pinning.
constexpr std::uint64_t kDefaultChunk = 4ull << 20;
constexpr std::uint64_t kMinChunk = 256ull << 10;
constexpr unsigned kMaxThreads = 16;
// Room for the unaligned head and the rounded-up tail of an O_DIRECT read.
constexpr std::uint64_t kSlotSlack = 2 * kDirectAlignment;

std::uint64_t slot_bytes(std::uint64_t chunk) {
  return (chunk + kSlotSlack + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
}

// Seconds since the last lap (or construction).
class Stopwatch {
 public:
  double lap() {
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - _last).count();
    _last = now;
    return seconds;
  }

 private:
  std::chrono::steady_clock::time_point _last = std::chrono::steady_clock::now();
};

// Waits for a stream's copies even when the worker leaves by an exception, so staging is never
// freed under a copy in flight.
struct StreamDrain {
  const Stream* stream;
  ~StreamDrain() {
    if (stream) shim::CudaDriver::get().cuStreamSynchronize(stream->get());
  }
};

class StagedRun {
 public:
  StagedRun(std::span<const CheckpointFile> files, std::span<const EngineChunk> chunks,
            const EngineSettings& settings, std::byte* staging, std::uint64_t total)
      : _chunks(chunks), _settings(settings), _staging(staging), _total(total) {
    for (const auto& f : files) _sources.push_back(std::make_unique<SourceFile>(f.path, settings.io));
  }

  void run() {
    std::vector<std::thread> workers;
    for (unsigned w = 0; w < _settings.threads; ++w) workers.emplace_back([this, w] { guarded(w); });
    for (auto& t : workers) t.join();
    if (_error) std::rethrow_exception(_error);
  }

  std::vector<FileLoadStats> file_stats() const {
    std::vector<FileLoadStats> out;
    for (const auto& s : _sources) out.push_back(s->stats());
    return out;
  }

  void add_thread_times(LoadStats& stats) const {
    std::lock_guard lock(_mutex);
    stats.setup_thread_seconds = _times.setup;
    stats.read_thread_seconds = _times.read;
    stats.wait_thread_seconds = _times.wait;
    stats.queue_thread_seconds = _times.queue;
  }

 private:
  void guarded(unsigned worker) {
    try {
      work(worker);
    } catch (...) {
      std::lock_guard lock(_mutex);
      if (!_error) _error = std::current_exception();
      _failed = true;
    }
  }

  struct ThreadTimes {
    double setup = 0, read = 0, wait = 0, queue = 0;
  };

  void work(unsigned worker) {
    ThreadTimes times;
    Stopwatch clock;
    const unsigned slots = _settings.slots_per_thread;
    const std::uint64_t stride = slot_bytes(_settings.chunk_bytes);
    std::byte* mine = _staging + static_cast<std::uint64_t>(worker) * slots * stride;
    std::optional<Stream> stream;
    std::vector<Event> done;
    if (_settings.gpu) {
      _settings.gpu->make_current();
      stream.emplace();
      for (unsigned s = 0; s < slots; ++s) done.emplace_back();
    }
    StreamDrain drain{stream ? &*stream : nullptr};
    times.setup += clock.lap();
    for (std::uint64_t k = 0; !_failed; ++k) {
      const std::size_t i = _next.fetch_add(1);
      if (i >= _chunks.size()) break;
      const EngineChunk& chunk = _chunks[i];
      const unsigned slot = static_cast<unsigned>(k % slots);
      std::byte* buffer = mine + slot * stride;
      if (stream) done[slot].synchronize();  // the slot's previous copies have finished
      times.wait += clock.lap();
      const std::byte* data = _sources[chunk.file_index]->read(chunk.file_offset, chunk.size, buffer);
      times.read += clock.lap();
      for (const CopyTask& c : chunk.copies) {
        if (stream) {
          FERRY_CU(cuMemcpyHtoDAsync, c.destination, data + c.chunk_offset, c.size, stream->get());
        } else {
          std::memcpy(reinterpret_cast<void*>(c.destination), data + c.chunk_offset, c.size);
        }
      }
      if (stream) done[slot].record(*stream);
      times.queue += clock.lap();
      report(chunk.size);
      clock.lap();
    }
    if (stream) stream->synchronize();
    times.wait += clock.lap();
    std::lock_guard lock(_mutex);
    _times.setup += times.setup;
    _times.read += times.read;
    _times.wait += times.wait;
    _times.queue += times.queue;
  }

  // Under the lock, so that the caller sees the count only grow.
  void report(std::uint64_t bytes) {
    std::lock_guard lock(_mutex);
    _done += bytes;
    if (_settings.progress) _settings.progress(_done, _total);
  }

  std::span<const EngineChunk> _chunks;
  const EngineSettings& _settings;
  std::byte* _staging;
  std::uint64_t _total;
  std::vector<std::unique_ptr<SourceFile>> _sources;
  std::atomic<std::size_t> _next{0};
  std::uint64_t _done = 0;
  std::atomic<bool> _failed{false};
  ThreadTimes _times;
  mutable std::mutex _mutex;
  std::exception_ptr _error;
};

}  // namespace

EngineSettings choose_settings(const LoadOptions& options) {
  EngineSettings s;
  s.io = options.io;
  s.progress = options.progress;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  // Whatever the caller leaves at zero comes from this machine's tuning file, else the defaults.
  const bool all_given = options.reader_threads && options.chunk_bytes && options.slots_per_thread;
  ActiveTuning active = all_given ? ActiveTuning{std::nullopt, "given by the caller"} : active_tuning();
  const std::optional<Tuning>& tuned = active.tuning;
  s.source = std::move(active.source);
  s.threads = options.reader_threads ? options.reader_threads
              : tuned               ? tuned->reader_threads
                                    : std::min(cores, kMaxThreads);
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
    s.chunk_bytes = (options.chunk_bytes + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
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

void run_staged(std::span<const CheckpointFile> files, std::span<const EngineChunk> chunks,
                EngineSettings settings, LoadStats& stats) {
  std::uint64_t total = 0;
  std::uint64_t largest = 0;
  for (const auto& c : chunks) {
    total += c.size;
    largest = std::max(largest, c.size);
  }
  // Small loads get small staging: no thread or slot without work.
  settings.threads = static_cast<unsigned>(
      std::clamp<std::uint64_t>(chunks.size(), 1, settings.threads));
  const std::uint64_t per_thread = (chunks.size() + settings.threads - 1) / settings.threads;
  settings.slots_per_thread = static_cast<unsigned>(
      std::clamp<std::uint64_t>(per_thread, 1, settings.slots_per_thread));
  settings.chunk_bytes = std::min(settings.chunk_bytes, std::max<std::uint64_t>(largest, 1));

  const auto started = std::chrono::steady_clock::now();
  const std::uint64_t staging_bytes =
      static_cast<std::uint64_t>(settings.threads) * settings.slots_per_thread *
      slot_bytes(settings.chunk_bytes);
  HostBuffer staging = take_staging(staging_bytes, settings.gpu);
  stats.staging_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  stats.staging_bytes = staging_bytes;
  stats.staging_pinned = staging.pinned();
  stats.reader_threads = settings.threads;
  stats.slots_per_thread = settings.slots_per_thread;
  stats.settings_source = settings.source;
  stats.chunk_bytes = settings.chunk_bytes;

  const auto opening = std::chrono::steady_clock::now();
  StagedRun run(files, chunks, settings, staging.data(), total);
  stats.open_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - opening).count();
  run.run();  // every copy out of staging has finished when this returns, even by exception
  keep_staging(std::move(staging));
  run.add_thread_times(stats);
  stats.files = run.file_stats();
  for (const auto& f : stats.files) stats.bytes_read += f.bytes_read;
}

}  // namespace ferry::detail
