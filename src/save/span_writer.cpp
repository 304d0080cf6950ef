#include "save/span_writer.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "cuda/cuda_resources.hpp"
#include "ferry/error.hpp"

namespace ferry::detail {
namespace {

std::uint64_t round_up(std::uint64_t value, std::uint64_t to) { return (value + to - 1) / to * to; }

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct Piece {
  std::size_t slot;
  std::uint64_t offset;
  std::uint64_t length;  // rounded up to kWriteAlignment
};

// Buffers circulate: free -> filled by the caller -> ready -> written by a writer -> free.
class Pipeline {
 public:
  explicit Pipeline(std::size_t slots) {
    for (std::size_t i = 0; i < slots; ++i) _free.push_back(i);
  }

  // A free slot; nullopt once a writer failed.
  std::optional<std::size_t> take_free() {
    std::unique_lock lock(_mutex);
    _changed.wait(lock, [&] { return !_free.empty() || _error; });
    if (_error) return std::nullopt;
    const std::size_t slot = _free.front();
    _free.pop_front();
    return slot;
  }

  void submit(Piece piece) {
    std::lock_guard lock(_mutex);
    _ready.push_back(piece);
    _changed.notify_all();
  }

  // The next piece to write; nullopt when the caller finished (or anyone failed) and none is left.
  std::optional<Piece> take_ready() {
    std::unique_lock lock(_mutex);
    _changed.wait(lock, [&] { return !_ready.empty() || _closed || _error; });
    if (_error || _ready.empty()) return std::nullopt;
    const Piece piece = _ready.front();
    _ready.pop_front();
    return piece;
  }

  void release(std::size_t slot) {
    std::lock_guard lock(_mutex);
    _free.push_back(slot);
    _changed.notify_all();
  }

  void fail(std::exception_ptr error) {
    std::lock_guard lock(_mutex);
    if (!_error) _error = error;
    _changed.notify_all();
  }

  void close() {
    std::lock_guard lock(_mutex);
    _closed = true;
    _changed.notify_all();
  }

  std::exception_ptr error() {
    std::lock_guard lock(_mutex);
    return _error;
  }

 private:
  std::mutex _mutex;
  std::condition_variable _changed;
  std::deque<std::size_t> _free;
  std::deque<Piece> _ready;
  bool _closed = false;
  std::exception_ptr _error;
};

// Joins the writers however the caller leaves, after telling them no more pieces come.
struct WriterThreads {
  Pipeline& pipeline;
  std::vector<std::thread> threads;
  ~WriterThreads() {
    pipeline.close();
    for (auto& t : threads) t.join();
  }
};

}  // namespace

SpanWriteStats write_spans(OutputFile& file, std::span<const MemorySpan> spans,
                           const SpanWriteOptions& options) {
  SpanWriteStats stats;
  for (const auto& s : spans) stats.bytes += s.size;
  if (stats.bytes == 0) return stats;

  // One retained context per GPU the spans live on; the first also pins the staging.
  std::map<int, std::unique_ptr<PrimaryContext>> contexts;
  for (const auto& s : spans)
    if (s.cuda_device >= 0 && s.size > 0 && !contexts.count(s.cuda_device))
      contexts.emplace(s.cuda_device, std::make_unique<PrimaryContext>(s.cuda_device));

  const std::uint64_t total = round_up(stats.bytes, kWriteAlignment);
  const std::uint64_t piece =
      std::min(round_up(std::max<std::uint64_t>(options.piece_bytes, 1), kWriteAlignment), total);
  const std::uint64_t pieces = total / piece + (total % piece != 0);
  const std::size_t slots = static_cast<std::size_t>(
      std::min<std::uint64_t>(std::max<std::uint64_t>(options.staging_bytes / piece, 2), pieces));
  HostBuffer staging(slots * piece, contexts.empty() ? nullptr : contexts.begin()->second.get());
  stats.staging_bytes = staging.size();
  stats.pinned = staging.pinned();

  Pipeline pipeline(slots);
  std::vector<double> write_seconds(std::max(1u, options.writer_threads), 0.0);
  {
    WriterThreads writers{pipeline, {}};
    for (std::size_t w = 0; w < write_seconds.size() && w < slots; ++w) {
      writers.threads.emplace_back([&, w] {
        try {
          while (auto p = pipeline.take_ready()) {
            const auto start = std::chrono::steady_clock::now();
            file.write_at(p->offset, staging.data() + p->slot * piece, p->length);
            write_seconds[w] += seconds_since(start);
            pipeline.release(p->slot);
          }
        } catch (...) {
          pipeline.fail(std::current_exception());
        }
      });
    }

    std::size_t span = 0;
    std::uint64_t within = 0;  // bytes of spans[span] already staged
    int current_device = -1;
    try {
      for (std::uint64_t offset = 0; offset < stats.bytes; offset += piece) {
        auto wait_start = std::chrono::steady_clock::now();
        const auto slot = pipeline.take_free();
        stats.wait_seconds += seconds_since(wait_start);
        if (!slot) break;
        const auto fill_start = std::chrono::steady_clock::now();
        std::byte* buffer = staging.data() + *slot * piece;
        const std::uint64_t want = std::min(piece, stats.bytes - offset);
        std::uint64_t filled = 0;
        while (filled < want) {
          const MemorySpan& s = spans[span];
          const std::uint64_t n = std::min(s.size - within, want - filled);
          if (n > 0 && s.cuda_device >= 0) {
            if (current_device != s.cuda_device) {
              contexts.at(s.cuda_device)->make_current();
              current_device = s.cuda_device;
            }
            FERRY_CU(cuMemcpyDtoH, buffer + filled,
                     reinterpret_cast<shim::cu::DevicePtr>(s.data + within), n);
          } else if (n > 0) {
            std::memcpy(buffer + filled, s.data + within, n);
          }
          filled += n;
          within += n;
          if (within == s.size) {
            ++span;
            within = 0;
          }
        }
        const std::uint64_t length = round_up(want, kWriteAlignment);
        std::memset(buffer + want, 0, length - want);  // cut off again at commit
        stats.fill_seconds += seconds_since(fill_start);
        pipeline.submit({*slot, offset, length});
      }
    } catch (...) {
      pipeline.fail(std::current_exception());
    }
  }
  if (auto error = pipeline.error()) std::rethrow_exception(error);
  for (double s : write_seconds) stats.write_seconds += s;
  return stats;
}

}  // namespace ferry::detail
