// The cuFile path, both directions: each span is split (cufile/aligned_split) into a 4 KiB-
// aligned body that cuFile moves straight between the file and GPU memory, and unaligned edges
// that go through host memory. Pieces run on the worker pool, sharing registered file handles
// from the process-wide cache.
#include <algorithm>
#include <atomic>

#include "cuda/cuda_resources.hpp"
#include "backends/cufile/aligned_split.hpp"
#include "backends/cufile/cufile_files.hpp"
#include "shim/gds_mode.hpp"
#include "ferry/error.hpp"
#include "platform/system.hpp"
#include "platform/file.hpp"
#include "shim/cufile.hpp"
#include "transfer/backend.hpp"
#include "transfer/ticket_state.hpp"
#include "services/worker_pool.hpp"

namespace ferry::detail {
namespace {

// Body pieces this large keep a thread's cuFile call long enough to amortise its overhead.
constexpr std::uint64_t kPieceBytes = 8ull << 20;

struct Task {
  std::uint32_t extent = 0;
  std::uint64_t file_offset = 0;
  MemorySpan span;
};

struct Run {
  std::shared_ptr<TicketState> ticket;
  std::vector<Task> tasks;
  std::vector<CuFileVerdict> verdicts;
  std::vector<std::atomic<std::uint64_t>> bytes;
  std::atomic<std::size_t> next{0};
  std::atomic<unsigned> jobs_left{0};
  explicit Run(std::size_t files) : bytes(files) {}
};

IoPath path_of(const CuFileVerdict& v) {
  return v.mode == CuFileMode::Gds ? IoPath::CufileGds : IoPath::CufileCompat;
}

void work(Run& run) {
  TicketState& t = *run.ticket;
  const RelaxedCaptureMode relaxed;  // a caller's graph capture survives this worker's syncs
  bool made_current = false;
  for (std::size_t i; !t.cancel && (i = run.next++) < run.tasks.size();) {
    const Task& task = run.tasks[i];
    const Extent& x = t.extents[task.extent];
    try {
      FERRY_EXPECT(task.span.device.is_cuda(), std::invalid_argument,
                   "the cufile backend moves GPU memory only: a span is on ",
                   task.span.device.to_string());
      if (!made_current) {
        device_context(task.span.device.index).make_current();
        if (t.options.after_event)
          FERRY_CU(cuEventSynchronize, static_cast<shim::cu::Event>(t.options.after_event));
        made_current = true;
      }
      // The file set's open file (its identity checked where it was closed and reopened),
      // registered once: the handle cache keys it by identity, not by path.
      auto open = t.files->acquire(x.file, true);
      const std::filesystem::path path = open->path();
      auto lease = cufile_handles().acquire(std::move(open));
      const auto address = reinterpret_cast<std::uintptr_t>(task.span.data);
      if (t.direction == Direction::FileToMemory) {
        cufile_read(lease, path, task.file_offset, address, task.span.size, t.registered_base,
                    kPieceBytes);
      } else {
        cufile_write(lease, path, task.file_offset, address, task.span.size, kPieceBytes);
      }
      run.bytes[x.file] += task.span.size;
      t.landed(task.extent, task.span.size);
    } catch (...) {
      t.fail(task.extent, std::current_exception());
    }
  }
}

void finish(Run& run) {
  TicketState& t = *run.ticket;
  TransferStats stats;
  stats.backend = "cufile";
  stats.chunk_bytes = kPieceBytes;
  for (std::uint32_t f = 0; f < run.verdicts.size(); ++f) {
    stats.files.push_back(
        {t.files->path(f), path_of(run.verdicts[f]), run.verdicts[f].reason, run.bytes[f].load()});
    stats.bytes_moved += run.bytes[f].load();
  }
  std::lock_guard lock(t.mutex);
  stats.threads = t.stats.threads;
  stats.note = t.stats.note;
  stats.route_note = t.stats.route_note;
  stats.route_seconds = t.stats.route_seconds;
  t.stats = std::move(stats);
}

class CufileBackend final : public TransferBackend {
 public:
  std::string_view name() const override { return "cufile"; }

  Verdict probe(const FileSet& files, const Device& device,
                const TransferOptions& options) const override {
    if (!device.is_cuda()) return {false, "", "cuFile moves GPU memory only"};
    const CuFileFacts& facts = probe_cufile();
    const CuFileVerdict driver = driver_verdict(facts);
    if (driver.mode == CuFileMode::Unavailable)
      return {false, "", "cuFile cannot run: " + driver.reason, true};
    for (std::uint32_t f = 0; f < files.size(); ++f) {
      const std::string path = files.path(f).string();
      const CuFileVerdict v = file_verdict(facts, filesystem_name(path));
      if (v.mode == CuFileMode::Gds) continue;
      if (options.backend == Backend::Auto) return {false, "", path + ": " + v.reason};
      if (!options.allow_compat)
        return {false, "",
                path + ": cuFile would run in compatibility mode (" + v.reason +
                    "); allow it explicitly (--allow-compat) or use --backend posix"};
    }
    return {true, driver.mode == CuFileMode::Gds ? "cufile-gds" : "cufile-compat", driver.reason};
  }

  void start(const std::shared_ptr<TicketState>& ticket) const override {
    TicketState& t = *ticket;
    auto run = std::make_shared<Run>(t.files->size());
    run->ticket = ticket;
    const CuFileFacts& facts = probe_cufile();
    for (std::uint32_t f = 0; f < t.files->size(); ++f)
      run->verdicts.push_back(file_verdict(facts, filesystem_name(t.files->path(f).string())));
    for (std::uint32_t e = 0; e < t.extents.size(); ++e) {
      std::uint64_t at = t.extents[e].file_offset;
      std::uint32_t tasks = 0;
      for (const MemorySpan& s : t.extents[e].spans) {
        if (s.data && s.size) {
          run->tasks.push_back({e, at, s});
          ++tasks;
        }
        at += s.size;
      }
      t.records[e].pieces_left = tasks;
    }
    WorkerPool& pool = transfer_workers();
    const unsigned wanted = static_cast<unsigned>(std::clamp<std::size_t>(
        run->tasks.size(), 1,
        std::min(t.options.threads ? t.options.threads : 16u, kMaxWorkerThreads)));
    const unsigned jobs = std::max(1u, std::min(wanted, pool.reserve(wanted)));
    if (jobs < wanted)
      t.stats.note += std::string(t.stats.note.empty() ? "" : "; ") + "ran " +
                      std::to_string(jobs) + " of " + std::to_string(wanted) +
                      " worker threads: " + pool.last_failure();
    t.stats.threads = jobs;
    run->jobs_left = jobs;
    {
      std::lock_guard lock(t.mutex);
      t.jobs_running = jobs;
      t.jobs_queuing = jobs;
    }
    for (unsigned j = 0; j < jobs; ++j)
      pool.post([run] {
        work(*run);
        run->ticket->job_queued({});  // cuFile calls are synchronous: all landed
        if (--run->jobs_left == 0) finish(*run);
        run->ticket->job_finished();
      });
  }
};

}  // namespace

const TransferBackend& cufile_backend() {
  static const CufileBackend backend;
  return backend;
}

RegisteredBuffer::RegisteredBuffer(std::uintptr_t base, std::uint64_t bytes) : _base(base) {
  const CuFileFacts& facts = probe_cufile();
  // Within cuFile's pinning limit only; reads into unregistered memory work, a little slower.
  if (bytes == 0 || bytes > facts.max_pinned_bytes) return;
  _registered = shim::CuFileLibrary::get()
                    .cuFileBufRegister(reinterpret_cast<const void*>(base), bytes, 0)
                    .err == shim::cufile::kSuccess;
}

RegisteredBuffer::~RegisteredBuffer() {
  if (_registered)
    shim::CuFileLibrary::get().cuFileBufDeregister(reinterpret_cast<const void*>(_base));
}

}  // namespace ferry::detail
