#include "kv/host_block_io.hpp"

#include <xxhash.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "ferry/error.hpp"
#include "platform/file_ops.hpp"
#include "platform/system.hpp"

namespace ferry::detail::kv {
namespace {

constexpr std::uint64_t kAlign = 4096;

constexpr std::size_t kMaxThreads = 4;
constexpr std::uint64_t kInFlightBytes = 16ull << 20;  // the blocks a batch has in flight at once
constexpr std::uint64_t kKeptBytes = 64ull << 20;      // the most bounce memory kept between calls

std::uint64_t total(std::span<const BlockSpan> pieces) {
  std::uint64_t sum = 0;
  for (const BlockSpan& p : pieces) sum += p.size;
  return sum;
}

std::uint64_t round_up(std::uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// One positioned transfer of exactly `size` bytes, retrying short transfers and EINTR; an
// EINVAL on the O_DIRECT descriptor switches the slab to buffered and retries there.
// Returns 0 or the errno of the failure.
template <bool kWrite>
int transfer(SlabFiles& slabs, int slab, std::byte* buffer, std::uint64_t size,
             std::uint64_t offset) {
  std::uint64_t done = 0;
  while (done < size) {
    const NativeDescriptor fd = slabs.fd(slab);
    const std::uint64_t at = offset + done;
    const std::int64_t n = kWrite ? write_some_at(fd, buffer + done, size - done, at)
                                  : read_some_at(fd, buffer + done, size - done, at);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EINVAL && slabs.direct(slab)) {
        slabs.fall_back_to_buffered(slab);
        continue;
      }
      return errno;
    }
    if (n == 0) return kWrite ? ENOSPC : EIO;  // a preallocated slab cannot end early
    done += static_cast<std::uint64_t>(n);
  }
  return 0;
}

void fail_request(BlockRequest& request, const SlabFiles& slabs, int error, const char* what) {
  request.outcome = BlockOutcome::io_error;
  request.message = detail::concat(slabs.name(request.slab), ": ", what, " at offset ",
                                   request.offset, " failed: ",
                                   std::generic_category().message(error));
}

}  // namespace

HostBlockIo::Buffer HostBlockIo::take_buffer() {
  {
    std::lock_guard lock(_idle_mutex);
    if (!_idle.empty()) {
      Buffer b = std::move(_idle.back());
      _idle.pop_back();
      return b;
    }
  }
  void* p = aligned_malloc(kAlign, _slot_bytes);
  if (p == nullptr) throw std::bad_alloc();
  return Buffer(static_cast<std::byte*>(p));
}

void HostBlockIo::give_buffer(Buffer buffer) {
  std::lock_guard lock(_idle_mutex);
  if ((_idle.size() + 1) * _slot_bytes <= kKeptBytes) _idle.push_back(std::move(buffer));
}

template <class One>
void HostBlockIo::for_each_block(std::span<BlockRequest> batch, One&& one) {
  std::atomic<std::size_t> next{0};
  std::vector<char> handled(batch.size(), 0);
  std::string error;
  std::mutex error_mutex;
  const auto work = [&] {
    try {
      Buffer buffer = take_buffer();
      for (std::size_t i; (i = next.fetch_add(1)) < batch.size(); handled[i] = 1)
        one(batch[i], buffer.get());
      give_buffer(std::move(buffer));
    } catch (const std::exception& e) {  // no buffer: the other threads take the rest
      std::lock_guard lock(error_mutex);
      if (error.empty()) error = e.what();
    }
  };
  std::vector<std::thread> helpers;
  const std::size_t threads = std::min<std::size_t>(
      {kMaxThreads, batch.size(), std::max<std::uint64_t>(1, kInFlightBytes / _slot_bytes)});
  try {
    for (std::size_t t = 1; t < threads; ++t) helpers.emplace_back(work);
  } catch (const std::system_error&) {
    // No more threads: those made (and the caller) do the work.
  }
  work();
  for (auto& t : helpers) t.join();
  for (std::size_t i = 0; i < batch.size(); ++i)
    if (!handled[i]) {  // taken by a thread that failed: every block still gets an outcome
      batch[i].outcome = BlockOutcome::io_error;
      batch[i].message = "the block was not moved: " + error;
    }
}

void HostBlockIo::write(std::span<BlockRequest> batch, void*) {
  for_each_block(batch, [&](BlockRequest& request, std::byte* buffer) {
    const std::uint64_t length = total(request.pieces);
    FERRY_ASSERT(length <= _slot_bytes);
    std::byte* at = buffer;
    for (const BlockSpan& piece : request.pieces) {
      FERRY_ASSERT(!piece.device.is_cuda());
      if (piece.size == 0) continue;
      std::memcpy(at, piece.data, piece.size);
      at += piece.size;
    }
    const std::uint64_t padded = round_up(length);
    std::memset(at, 0, padded - length);
    request.checksum = XXH3_64bits(buffer, length);
    const int error = transfer<true>(_slabs, request.slab, buffer, padded, request.offset);
    request.route = KVRoute::host;
    if (error != 0)
      fail_request(request, _slabs, error, "write of a block");
    else
      request.outcome = BlockOutcome::ok;
  });
}

void HostBlockIo::read(std::span<BlockRequest> batch) {
  for_each_block(batch, [&](BlockRequest& request, std::byte* buffer) {
    const std::uint64_t length = total(request.pieces);
    FERRY_ASSERT(length <= _slot_bytes);
    request.route = KVRoute::host;
    const int error =
        transfer<false>(_slabs, request.slab, buffer, round_up(length), request.offset);
    if (error != 0) return fail_request(request, _slabs, error, "read of a block");
    if (XXH3_64bits(buffer, length) != request.checksum) {
      request.outcome = BlockOutcome::checksum_mismatch;
      request.message = detail::concat(_slabs.name(request.slab), ": block at offset ",
                                       request.offset, " fails its checksum; dropped");
      return;
    }
    const std::byte* from = buffer;
    for (const BlockSpan& piece : request.pieces) {
      FERRY_ASSERT(!piece.device.is_cuda());
      if (piece.size == 0) continue;
      std::memcpy(piece.data, from, piece.size);
      from += piece.size;
    }
    request.outcome = BlockOutcome::ok;
  });
}

void HostBlockIo::sync(int slab) {
  if (!sync_data(_slabs.buffered_fd(slab))) FERRY_SYSCALL_FAIL(_slabs.name(slab), ": fdatasync");
}

bool HostBlockIo::direct() const {
  for (unsigned i = 0; i < _slabs.count(); ++i)
    if (!_slabs.direct(static_cast<int>(i))) return false;
  return true;
}

}  // namespace ferry::detail::kv
