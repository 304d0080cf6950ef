#include "transfer/cufile_engine.hpp"

#include <atomic>
#include <exception>
#include <mutex>
#include <thread>

#include "cuda/cuda_resources.hpp"
#include "cufile/aligned_split.hpp"
#include "cufile/cufile_files.hpp"
#include "ferry/error.hpp"
#include "shim/cufile.hpp"

namespace ferry::detail {
namespace {

// Body pieces this large keep a thread's cuFile call long enough to amortise its overhead.
constexpr std::uint64_t kPieceBytes = 8ull << 20;

struct Task {
  std::uint32_t file = 0;
  std::uint64_t file_offset = 0;
  std::uintptr_t destination = 0;
  std::uint64_t size = 0;
};

std::vector<Task> make_tasks(std::span<const EngineChunk> chunks) {
  std::vector<Task> tasks;
  for (const auto& chunk : chunks)
    for (const auto& copy : chunk.copies) {
      const std::uint64_t at = chunk.file_offset + copy.chunk_offset;
      for (const auto& p : split_aligned(at, copy.size, kPieceBytes))
        tasks.push_back({chunk.file_index, p.file_offset, copy.destination + p.buffer_offset, p.size});
    }
  return tasks;
}

IoPath path_of(const CuFileVerdict& v) {
  return v.mode == CuFileMode::Gds ? IoPath::CufileGds : IoPath::CufileCompat;
}

}  // namespace

void run_cufile(std::span<const CheckpointFile> files, std::span<const EngineChunk> chunks,
                const EngineSettings& settings, std::span<const CuFileVerdict> verdicts,
                std::uintptr_t registered_base, LoadStats& stats) {
  FERRY_ASSERT(settings.gpu != nullptr && verdicts.size() == files.size());
  const std::vector<Task> tasks = make_tasks(chunks);
  std::uint64_t total = 0;
  for (const auto& t : tasks) total += t.size;
  std::vector<std::atomic<std::uint64_t>> bytes(files.size());
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mutex;
  std::exception_ptr error;
  std::uint64_t done = 0;

  auto work = [&] {
    try {
      settings.gpu->make_current();
      for (std::size_t i; !failed && (i = next++) < tasks.size();) {
        const Task& t = tasks[i];
        const auto& path = files[t.file].path;
        auto lease = cufile_handles().acquire(path);
        cufile_read(lease, path, t.file_offset, t.destination, t.size, registered_base, kPieceBytes);
        bytes[t.file] += t.size;
        std::lock_guard lock(mutex);
        done += t.size;
        if (settings.progress) settings.progress(done, total);
      }
    } catch (...) {
      std::lock_guard lock(mutex);
      if (!error) error = std::current_exception();
      failed = true;
    }
  };
  const unsigned threads = static_cast<unsigned>(
      std::min<std::size_t>(settings.threads, std::max<std::size_t>(1, tasks.size())));
  std::vector<std::thread> pool;
  for (unsigned i = 0; i < threads; ++i) pool.emplace_back(work);
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);

  stats.reader_threads = threads;
  stats.chunk_bytes = kPieceBytes;
  for (std::size_t f = 0; f < files.size(); ++f) {
    stats.files.push_back({files[f].path, path_of(verdicts[f]), verdicts[f].reason, bytes[f].load()});
    stats.bytes_read += bytes[f].load();
  }
}

BackendChoice choose_backend(std::span<const CheckpointFile> files, const LoadOptions& options) {
  BackendChoice choice;
  if (options.backend == Backend::Posix) return choice;
  FERRY_EXPECT(options.device.is_cuda() || options.backend != Backend::Cufile, std::invalid_argument,
               "the cufile backend reads into GPU memory: it needs --device cuda:N");
  if (!options.device.is_cuda()) return choice;
  // Without nvidia-fs no file can get true GPUDirect Storage: auto need not start cuFile.
  if (options.backend == Backend::Auto && !nvidia_fs_present()) {
    choice.note = "cuFile not used: no nvidia-fs driver, so no GPUDirect Storage";
    return choice;
  }
  const CuFileFacts& facts = probe_cufile();
  const CuFileVerdict driver = driver_verdict(facts);
  if (driver.mode == CuFileMode::Unavailable) {
    FERRY_EXPECT(options.backend != Backend::Cufile, CudaError, "cuFile cannot run: ", driver.reason);
    choice.note = "cuFile not used: " + driver.reason;
    return choice;
  }
  for (const auto& f : files) {
    CuFileVerdict v = file_verdict(facts, filesystem_name(f.path.string()));
    if (v.mode != CuFileMode::Gds) {
      if (options.backend == Backend::Auto) {
        choice.note = "cuFile not used: " + f.path.string() + ": " + v.reason;
        return choice;
      }
      FERRY_EXPECT(options.allow_compat, std::invalid_argument, f.path.string(),
                   ": cuFile would run in compatibility mode (", v.reason,
                   "); allow it explicitly (--allow-compat) or use --backend posix");
    }
    choice.verdicts.push_back(std::move(v));
  }
  choice.cufile = true;
  return choice;
}

RegisteredBuffer::RegisteredBuffer(std::uintptr_t base, std::uint64_t bytes) : _base(base) {
  const CuFileFacts& facts = probe_cufile();
  // Within cuFile's pinning limit only; reads into unregistered memory work, a little slower.
  if (bytes == 0 || bytes > facts.max_pinned_bytes) return;
  _registered =
      shim::CuFileLibrary::get().cuFileBufRegister(reinterpret_cast<const void*>(base), bytes, 0).err ==
      shim::cufile::kSuccess;
}

RegisteredBuffer::~RegisteredBuffer() {
  if (_registered) shim::CuFileLibrary::get().cuFileBufDeregister(reinterpret_cast<const void*>(_base));
}

}  // namespace ferry::detail
