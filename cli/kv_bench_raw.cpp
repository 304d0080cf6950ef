// kv_bench_raw.hpp: raw I/O of the same bytes as the store moves.
#include "kv_bench_raw.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "cuda/cuda_resources.hpp"
#include "ferry/error.hpp"
#include "kv_bench_memory.hpp"
#include "platform/thread_barrier.hpp"

namespace ferry::kv_bench {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
constexpr std::uint64_t kAlign = 4096;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::uint64_t round_up(std::uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

RawFile::RawFile(fs::path file, std::uint64_t block, std::uint64_t count, std::uint64_t batch)
    : _path(std::move(file)), _slot(round_up(block)), _count(count), _batch(batch) {
  _buffered = detail::open_or_create(_path, 0600);
  if (!_buffered) FERRY_SYSCALL_FAIL(_path.string(), ": cannot open");
  if (const int error = detail::preallocate(_buffered.get(), _slot * count); error != 0)
    detail::fail_errno(error, _path.string(), ": fallocate");
  _direct = detail::open_existing(_path, true, true);  // empty where O_DIRECT is refused
  _threads = std::min<std::uint64_t>(kThreads, batch);
  // A buffer for each block of a batch, in one allocation, as the store's blocks are: the same
  // I/O from 16 buffers reused ran up to 15 % faster on a virtio disk (BENCHMARKS.md,
  // 2026-12-05), a rate no store moving distinct blocks could reach.
  const std::uint64_t bytes = _slot * std::min(batch, count);
  _memory = detail::allocate_host_memory(bytes);
  std::memset(_memory.get(), 0x5A, bytes);
}

RawFile::~RawFile() {
  _direct = {};
  _buffered = {};  // closed before the removal (Windows removes an open file only at its close)
  std::error_code ignored;
  fs::remove(_path, ignored);
}

double RawFile::write(std::size_t threads) { return pass(true, direct(), threads); }

double RawFile::read_cold() {
  drop_cache(_path);
  return pass(false, direct());
}

double RawFile::read_warm() {
  warm(_path);
  return pass(false, _buffered.get());
}

detail::NativeDescriptor RawFile::direct() const {
  return _direct ? _direct.get() : _buffered.get();
}

// The threads stay for the whole pass, meeting at a barrier after each batch (whose last
// arrival syncs a write batch), so no thread is made per batch.
double RawFile::pass(bool writing, detail::NativeDescriptor fd, std::size_t wanted) {
  const std::size_t threads = wanted ? std::min(wanted, _threads) : _threads;
  const std::uint64_t buffers = std::min(_batch, _count);
  const std::uint64_t batches = (_count + _batch - 1) / _batch;
  std::atomic<bool> failed{false};
  // Not std::barrier: it loses wake-ups in the Windows build (platform/thread_barrier.hpp).
  detail::ThreadBarrier meet(threads, [&]() noexcept {
    if (writing && !detail::sync_data(fd)) failed = true;
  });
  const auto start = Clock::now();
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (std::uint64_t b = 0; b < batches; ++b) {
        const std::uint64_t first = b * _batch, end = std::min(_count, first + _batch);
        for (std::uint64_t i = first + t; i < end; i += threads) {
          std::byte* buffer = static_cast<std::byte*>(_memory.get()) + (i % buffers) * _slot;
          const std::int64_t done = writing ? detail::write_some_at(fd, buffer, _slot, i * _slot)
                                            : detail::read_some_at(fd, buffer, _slot, i * _slot);
          if (done != static_cast<std::int64_t>(_slot)) failed = true;
        }
        meet.arrive_and_wait();
      }
    });
  for (auto& t : pool) t.join();
  FERRY_EXPECT(!failed, std::runtime_error, _path.string(), ": raw ",
               writing ? "pwrite or fdatasync" : "pread", " failed");
  return seconds_since(start);
}

}  // namespace ferry::kv_bench
