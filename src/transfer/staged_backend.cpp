// The staged path, both directions. File -> memory: a worker reads a chunk into one of its
// pinned slots and queues the copies out of it on its stream, then reads the next chunk into
// the next slot while they run; a slot is reused only after the fence behind its copies.
// Memory -> file: the worker copies the spans into a slot, waits for them, and writes the slot
// (O_DIRECT for the aligned body, buffered edges).
#include <algorithm>
#include <chrono>
#include <thread>

#include "ferry/error.hpp"
#include "io/source_file.hpp"
#include "transfer/backend.hpp"
#include "transfer/copier.hpp"
#include "transfer/pinned_pool.hpp"
#include "transfer/ticket_state.hpp"
#include "transfer/worker_pool.hpp"

namespace ferry::detail {
namespace {

constexpr std::uint64_t kDefaultChunk = 4ull << 20;
constexpr unsigned kDefaultThreads = 16;
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

// `size` bytes at `extent_offset` of extent `extent`: one chunk of work.
struct Piece {
  std::uint32_t extent = 0;
  std::uint64_t extent_offset = 0;
  std::uint64_t size = 0;
};

struct Settings {
  unsigned threads = 1;
  unsigned slots = 2;
  std::uint64_t chunk = kDefaultChunk;
};

// What the jobs of one submission share.
struct Run {
  std::shared_ptr<TicketState> ticket;
  Settings settings;
  std::vector<Piece> pieces;
  std::vector<std::unique_ptr<SourceFile>> files;
  bool pin = false;
  int pin_ordinal = 0;
  std::atomic<std::size_t> next{0};
  std::mutex mutex;  // guards what follows
  unsigned jobs_left = 0;
  TransferStats stats;
};

// Cuts every extent into pieces of at most `chunk` bytes, ending on page boundaries where an
// extent is split so that O_DIRECT transfers stay aligned.
std::vector<Piece> cut(const std::vector<Extent>& extents, std::uint64_t chunk,
                       std::vector<std::uint32_t>& pieces_per_extent) {
  std::vector<Piece> pieces;
  pieces_per_extent.assign(extents.size(), 0);
  for (std::uint32_t e = 0; e < extents.size(); ++e) {
    std::uint64_t total = 0;
    for (const auto& s : extents[e].spans) total += s.size;
    for (std::uint64_t at = 0; at < total;) {
      const std::uint64_t file_at = extents[e].file_offset + at;
      std::uint64_t end = std::min(total, at + chunk);
      if (end < total) {
        const std::uint64_t aligned = (file_at + chunk) / kDirectAlignment * kDirectAlignment;
        if (aligned > file_at) end = aligned - extents[e].file_offset;
      }
      pieces.push_back({e, at, end - at});
      ++pieces_per_extent[e];
      at = end;
    }
  }
  return pieces;
}

Settings configure(const TransferOptions& o, const std::vector<Piece>& pieces) {
  Settings s;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  s.threads = std::min(o.threads ? o.threads : std::min(cores, kDefaultThreads), kMaxWorkerThreads);
  s.slots = o.slots_per_thread ? std::min(o.slots_per_thread, 64u) : 2;
  s.chunk = o.chunk_bytes
                ? (o.chunk_bytes + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment
                : kDefaultChunk;
  const auto fits = [&] {
    return std::uint64_t{s.slots} * s.threads * slot_bytes(s.chunk) <= o.staging_bytes;
  };
  while (s.threads > 1 && !fits()) --s.threads;
  FERRY_EXPECT(fits(), std::invalid_argument, "staging of ", o.staging_bytes, " bytes cannot hold ",
               s.slots, " slots of ", s.chunk, "-byte reads");
  if (pieces.empty()) return s;
  // Small batches get small staging: no thread or slot without work.
  std::uint64_t largest = 0;
  for (const auto& p : pieces) largest = std::max(largest, p.size);
  s.threads = static_cast<unsigned>(std::clamp<std::uint64_t>(pieces.size(), 1, s.threads));
  const std::uint64_t per_thread = (pieces.size() + s.threads - 1) / s.threads;
  s.slots = static_cast<unsigned>(std::clamp<std::uint64_t>(per_thread, 1, s.slots));
  s.chunk = std::min(s.chunk, std::max<std::uint64_t>(largest, 1));
  return s;
}

// Calls fn(span, offset in span, offset in piece, bytes) for the spans under the piece.
template <class Fn>
void for_spans(const Extent& x, const Piece& p, Fn&& fn) {
  std::uint64_t span_start = 0;
  const std::uint64_t end = p.extent_offset + p.size;
  for (const MemorySpan& s : x.spans) {
    const std::uint64_t span_end = span_start + s.size;
    if (span_end > p.extent_offset && span_start < end) {
      const std::uint64_t from = std::max(span_start, p.extent_offset);
      const std::uint64_t to = std::min(span_end, end);
      fn(s, from - span_start, from - p.extent_offset, to - from);
    }
    if (span_end >= end) break;
    span_start = span_end;
  }
}

class Job {
 public:
  explicit Job(std::shared_ptr<Run> run) : _run(std::move(run)), _t(*_run->ticket) {}

  void operator()() {
    Stopwatch clock;
    double setup = 0, read = 0, wait = 0, queue = 0, staging = 0;
    std::uint64_t staged_bytes = 0;
    bool pinned = false;
    {
      PinnedPool::Lease lease;
      try {
        lease = staging_pool().lease(slot_bytes(_run->settings.chunk), _run->settings.slots, 1,
                                     _run->pin ? &device_context(_run->pin_ordinal) : nullptr);
        staging = clock.lap();
        staged_bytes = std::uint64_t{lease.slots()} * lease.slot_bytes();
        pinned = lease.pinned();
        loop(lease, setup, read, wait, queue, clock);
      } catch (...) {
        // The job could not start (no staging, no stream): its pieces fall to the other jobs,
        // or, where none is left, are failed by finish().
        std::lock_guard lock(_t.mutex);
        if (!_t.first_error) _t.first_error = std::current_exception();
      }
      std::vector<std::unique_ptr<Event>> ends;
      try {
        for (auto& [d, c] : _copiers)
          if (auto e = c->mark_end()) ends.push_back(std::move(e));
      } catch (...) {
        // A stream that cannot take an event has failed its copies already.
      }
      _t.job_queued(std::move(ends));
      for (auto& [device, copier] : _copiers) copier->drain();
      wait += clock.lap();
      _copiers.clear();
    }
    std::lock_guard lock(_run->mutex);
    TransferStats& s = _run->stats;
    s.staging_bytes += staged_bytes;
    s.staging_pinned = s.staging_pinned || pinned;
    s.staging_seconds = std::max(s.staging_seconds, staging);
    s.setup_thread_seconds += setup;
    s.read_thread_seconds += read;
    s.wait_thread_seconds += wait;
    s.queue_thread_seconds += queue;
  }

 private:
  Copier& copier(const Device& device) {
    for (auto& [d, c] : _copiers)
      if (d == device) return *c;
    auto c = make_copier(device, _run->settings.slots);
    c->after(_t.options.after_event);
    _copiers.emplace_back(device, std::move(c));
    return *_copiers.back().second;
  }

  void loop(const PinnedPool::Lease& lease, double& setup, double& read, double& wait,
            double& queue, Stopwatch& clock) {
    const unsigned slots = lease.slots();
    // The devices come first: their streams and fences are made before the clock runs.
    for (const auto& x : _t.extents)
      for (const auto& s : x.spans)
        if (s.device.is_cuda()) copier(s.device);
    setup += clock.lap();
    std::uint32_t open_index = UINT32_MAX;
    std::shared_ptr<const PlatformFile> open_file;
    for (std::uint64_t k = 0; !_t.cancel.load(std::memory_order_relaxed); ++k) {
      const std::size_t i = _run->next.fetch_add(1);
      if (i >= _run->pieces.size()) break;
      const Piece& p = _run->pieces[i];
      const Extent& x = _t.extents[p.extent];
      const unsigned slot = static_cast<unsigned>(k % slots);
      std::byte* buffer = lease.slot(slot);
      for (auto& [d, c] : _copiers) c->wait(slot);  // the slot's previous copies have finished
      wait += clock.lap();
      try {
        SourceFile& file = *_run->files[x.file];
        if (open_index != x.file) {
          open_file.reset();  // closable while the next one opens
          open_index = UINT32_MAX;
          open_file = file.open();
          open_index = x.file;
        }
        const std::uint64_t at = x.file_offset + p.extent_offset;
        if (_t.direction == Direction::FileToMemory) {
          const std::byte* data = file.read(*open_file, at, p.size, buffer);
          read += clock.lap();
          for_spans(x, p,
                    [&](const MemorySpan& s, std::uint64_t in_span, std::uint64_t in_piece,
                        std::uint64_t n) {
                      if (s.data)
                        copier(s.device).put(reinterpret_cast<std::uintptr_t>(s.data) + in_span,
                                             data + in_piece, n);
                    });
          for (auto& [d, c] : _copiers) c->fence(slot);
          queue += clock.lap();
        } else {
          std::byte* data = buffer + at % kDirectAlignment;
          for_spans(x, p,
                    [&](const MemorySpan& s, std::uint64_t in_span, std::uint64_t in_piece,
                        std::uint64_t n) {
                      copier(s.device).get(data + in_piece,
                                           reinterpret_cast<std::uintptr_t>(s.data) + in_span, n);
                    });
          for (auto& [d, c] : _copiers) {
            c->fence(slot);
            c->wait(slot);
          }
          queue += clock.lap();
          file.write(*open_file, at, p.size, buffer);
          read += clock.lap();
        }
        _t.landed(p.extent, p.size);
      } catch (...) {
        _t.fail(p.extent, std::current_exception());
        clock.lap();
      }
    }
  }

  std::shared_ptr<Run> _run;
  TicketState& _t;
  std::vector<std::pair<Device, std::unique_ptr<Copier>>> _copiers;
};

// The last job of a run: durability, statistics, completion.
void finish(Run& run) {
  TicketState& t = *run.ticket;
  TransferStats stats;
  {
    std::lock_guard lock(run.mutex);
    stats = run.stats;
  }
  for (std::uint32_t f = 0; f < run.files.size(); ++f) {
    SourceFile& file = *run.files[f];
    if (file.touched() && t.options.durable && t.direction == Direction::MemoryToFile) {
      try {
        file.open()->sync();
      } catch (...) {
        for (std::size_t e = 0; e < t.extents.size(); ++e)
          if (t.extents[e].file == f) t.fail(e, std::current_exception());
      }
    }
    if (file.touched()) {
      stats.files.push_back(file.stats());
    } else {
      stats.files.push_back(
          {t.files->path(f), IoPath::Buffered, "not touched by this transfer", 0});
    }
    stats.bytes_moved += stats.files.back().bytes_read;
  }
  std::lock_guard lock(t.mutex);
  stats.backend = "staged";
  stats.note = t.stats.note;
  t.stats = std::move(stats);
}

class StagedBackend final : public TransferBackend {
 public:
  std::string_view name() const override { return "staged"; }

  Verdict probe(const FileSet&, const Device&, const TransferOptions&) const override {
    return {true, "staged", "reads and writes through pinned host staging"};
  }

  void start(const std::shared_ptr<TicketState>& ticket) const override {
    auto run = std::make_shared<Run>();
    run->ticket = ticket;
    TicketState& t = *ticket;
    std::vector<std::uint32_t> per_extent;
    Settings wanted = configure(t.options, {});
    run->pieces = cut(t.extents, wanted.chunk, per_extent);
    for (std::size_t e = 0; e < per_extent.size(); ++e) t.records[e].pieces_left = per_extent[e];
    run->settings = configure(t.options, run->pieces);
    for (const auto& x : t.extents)
      for (const auto& s : x.spans)
        if (s.device.is_cuda() && !run->pin) {
          run->pin = true;
          run->pin_ordinal = s.device.index;
        }
    const bool writing = t.direction == Direction::MemoryToFile;
    for (std::uint32_t f = 0; f < t.files->size(); ++f)
      run->files.push_back(std::make_unique<SourceFile>(t.files, f, t.options.io, writing));
    // Threads the system refuses are not fatal: fewer workers run, or the caller's thread.
    WorkerPool& pool = transfer_workers();
    const unsigned available = pool.reserve(run->settings.threads);
    unsigned jobs = run->settings.threads;
    if (available < jobs) {
      jobs = std::max(1u, available);
      t.stats.note += std::string(t.stats.note.empty() ? "" : "; ") + "ran " +
                      std::to_string(jobs) + " of " + std::to_string(run->settings.threads) +
                      " worker threads: " + pool.last_failure();
    }
    run->stats.threads = jobs;
    run->stats.slots_per_thread = run->settings.slots;
    run->stats.chunk_bytes = run->settings.chunk;
    run->jobs_left = jobs;
    {
      std::lock_guard lock(t.mutex);
      t.jobs_running = jobs;
      t.jobs_queuing = jobs;
    }
    for (unsigned j = 0; j < jobs; ++j)
      pool.post([run] {
        Job job(run);
        job();
        bool last = false;
        {
          std::lock_guard lock(run->mutex);
          last = --run->jobs_left == 0;
        }
        if (last) finish(*run);
        run->ticket->job_finished();
      });
  }
};

}  // namespace

const TransferBackend& staged_backend() {
  static const StagedBackend backend;
  return backend;
}

}  // namespace ferry::detail
