#include "kv/host_block_io.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "ferry/error.hpp"
#include "kv/block_hasher.hpp"
#include "kv/checksum.hpp"
#include "platform/file.hpp"
#include "platform/file_ranges.hpp"
#include "platform/system.hpp"
#include "services/worker_pool.hpp"

namespace ferry::detail::kv {
namespace {

constexpr std::uint64_t kAlign = 4096;

constexpr std::size_t kMaxInFlight = 16;              // blocks of a batch moving at once
constexpr std::size_t kMinSharedWrites = 2;           // a fleet writer's writes in flight, at least
constexpr std::uint64_t kBounceBytes = 256ull << 20;  // the most bounce memory one batch uses
constexpr std::uint64_t kKeptBytes = 64ull << 20;     // the most bounce memory kept between calls

std::uint64_t total(std::span<const BlockSpan> pieces) {
  std::uint64_t sum = 0;
  for (const BlockSpan& p : pieces) sum += p.size;
  return sum;
}

std::uint64_t round_up(std::uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % kAlign == 0; }

// A block O_DIRECT can move straight between the caller's memory and its slot: `body` the spans
// that are 4 KiB-aligned in address and length (every piece but the last, and the last's whole
// pages where it starts on a page), `tail` what is left of the last piece, at most one page,
// which moves through a page of its own. That covers one aligned piece of any length, vLLM's
// per-layer pages of a page-aligned tensor, and a chunk with its key trailer (vLLM's KV tier).
struct DirectSplit {
  std::vector<BlockSpan> body;
  std::uint64_t body_bytes = 0;
  BlockSpan tail;
};

bool split_direct(const BlockRequest& r, DirectSplit& out) {
  const BlockSpan* last = nullptr;  // the last piece with bytes; the ones before go whole
  for (const BlockSpan& p : r.pieces)
    if (p.size > 0) last = &p;
  if (last == nullptr) return false;
  out = {};
  out.body.reserve(r.pieces.size());
  for (const BlockSpan* p = r.pieces.data(); p != last; ++p) {
    if (p->size == 0) continue;
    if (!aligned(p->data) || p->size % kAlign) return false;
    out.body.push_back(*p);
    out.body_bytes += p->size;
  }
  BlockSpan tail = *last;
  if (aligned(tail.data) && tail.size >= kAlign) {
    const std::uint64_t whole = tail.size / kAlign * kAlign;
    out.body.push_back({tail.data, whole, tail.device});
    out.body_bytes += whole;
    tail = {static_cast<std::byte*>(tail.data) + whole, tail.size - whole, tail.device};
  }
  if (tail.size > kAlign) return false;
  out.tail = tail;
  return true;
}

// Whether the block moves without the bounce buffer.
bool straight(const BlockRequest& r) {
  DirectSplit split;
  return split_direct(r, split);
}

std::uint64_t block_checksum(std::span<const BlockSpan> pieces) {
  if (pieces.size() == 1) return checksum(pieces[0].data, pieces[0].size);
  StreamingHash hash;
  for (const BlockSpan& p : pieces) hash.update(p.data, p.size);
  return hash.digest();
}

// The split's spans and, where it has a tail, the page it moves through after them: one
// vectored O_DIRECT call per block (a key trailer's page is no I/O of its own).
std::vector<BlockSpan> with_tail_page(const DirectSplit& split, std::byte* page) {
  std::vector<BlockSpan> spans = split.body;
  if (split.tail.size > 0) spans.push_back({page, kAlign, Device::cpu()});
  return spans;
}

std::string direct_reason(const DirectSplit& split, const char* how) {
  return concat("host memory: O_DIRECT ", how, " its pieces (", split.body.size(),
                " 4 KiB-aligned span(s)",
                split.tail.size > 0 ? ", the last partial page through a page of its own)" : ")");
}

// One positioned transfer of exactly `size` bytes (O_DIRECT in calls of at most kMaxDirectCall),
// retrying short transfers and EINTR; an EINVAL on the O_DIRECT descriptor switches the slab to
// buffered and retries there.
// Returns 0 or the errno of the failure.
template <bool kWrite>
int transfer(SlabFiles& slabs, int slab, std::byte* buffer, std::uint64_t size,
             std::uint64_t offset) {
  std::uint64_t done = 0;
  while (done < size) {
    const NativeDescriptor fd = slabs.fd(slab);
    const std::uint64_t at = offset + done;
    const std::uint64_t want =
        slabs.direct(slab) ? std::min(size - done, kMaxDirectCall) : size - done;
    const std::int64_t n = kWrite ? write_some_at(fd, buffer + done, want, at)
                                  : read_some_at(fd, buffer + done, want, at);
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

// How many of `slices` one call of at most `cap` bytes takes (into `count`), and the bytes it
// takes of the last of them where that one is cut (else 0). `cap` and all but the last slice of
// an O_DIRECT call are multiples of 4 KiB, so a cut falls on a page.
std::size_t cap_slices(std::span<const IoSlice> slices, std::uint64_t cap, std::size_t& count) {
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < slices.size(); ++i) {
    if (sum + slices[i].size >= cap) {
      count = i + 1;
      return sum + slices[i].size > cap ? static_cast<std::size_t>(cap - sum) : 0;
    }
    sum += slices[i].size;
  }
  count = slices.size();
  return 0;
}

// The pieces by preadv/pwritev (in windows of kMaxSlices; O_DIRECT in calls of at most
// kMaxDirectCall bytes), short transfers resumed; buffered, or O_DIRECT where `direct` (an
// EINVAL there switches the slab to buffered, and the rest goes that way). Returns 0 or the errno
// of the failure.
template <bool kWrite>
int transfer_pieces(SlabFiles& slabs, int slab, std::span<const BlockSpan> pieces,
                    std::uint64_t offset, bool direct = false) {
  constexpr std::size_t kMaxSlices = 1024;  // IOV_MAX on Linux
  std::vector<IoSlice> iov;
  iov.reserve(std::min<std::size_t>(pieces.size(), kMaxSlices));
  for (std::size_t first = 0; first < pieces.size();) {
    iov.clear();
    std::uint64_t want = 0;
    for (; first < pieces.size() && iov.size() < kMaxSlices; ++first) {
      if (pieces[first].size == 0) continue;
      iov.push_back({pieces[first].data, pieces[first].size});
      want += pieces[first].size;
    }
    std::size_t at = 0;
    while (want > 0) {
      const NativeDescriptor fd = direct ? slabs.fd(slab) : slabs.buffered_fd(slab);
      const bool capped = direct && slabs.direct(slab);
      // O_DIRECT: at most kMaxDirectCall bytes a call, its last slice cut short for the call.
      std::size_t count = iov.size() - at;
      std::size_t cut = 0;
      if (capped) cut = cap_slices(std::span(iov).subspan(at), kMaxDirectCall, count);
      const std::size_t last = at + count - 1;
      const std::size_t whole = std::exchange(iov[last].size, cut ? cut : iov[last].size);
      const std::int64_t n = kWrite ? write_slices_at(fd, &iov[at], count, offset)
                                    : read_slices_at(fd, &iov[at], count, offset);
      iov[last].size = whole;
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EINVAL && direct && slabs.direct(slab)) {
        slabs.fall_back_to_buffered(slab);
        continue;
      }
      if (n < 0) return errno;
      if (n == 0) return kWrite ? ENOSPC : EIO;
      auto left = static_cast<std::uint64_t>(n);
      offset += left;
      want -= left;
      for (; left > 0 && left >= iov[at].size; ++at) left -= iov[at].size;
      if (left > 0) {
        iov[at].data = static_cast<std::byte*>(iov[at].data) + left;
        iov[at].size -= left;
      }
    }
  }
  return 0;
}

void fail_request(BlockRequest& request, const SlabFiles& slabs, int error, const char* what) {
  request.outcome = BlockOutcome::io_error;
  request.message =
      detail::concat(slabs.name(request.slab), ": ", what, " at offset ", request.offset,
                     " failed: ", std::generic_category().message(error));
}

void mismatch(BlockRequest& request, const SlabFiles& slabs) {
  request.outcome = BlockOutcome::checksum_mismatch;
  request.message = detail::concat(slabs.name(request.slab), ": block at offset ", request.offset,
                                   " fails its checksum; dropped");
}

// The batch's blocks handed out one at a time to the caller and pool threads. Pool threads hold
// it by shared_ptr: one that wakes after the batch is done finds nothing left and touches
// nothing else.
struct Batch {
  explicit Batch(std::size_t n) : size(n) {}
  const std::size_t size;
  std::atomic<std::size_t> next{0};
  std::mutex mutex;
  std::condition_variable done;
  std::size_t finished = 0;  // under mutex
  void finish_one() {
    bool last = false;
    {
      std::lock_guard lock(mutex);
      last = ++finished == size;
    }
    if (last) done.notify_all();
  }
};

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
  void* p = aligned_malloc(kAlign, round_up(_slot_bytes));
  if (p == nullptr) throw std::bad_alloc();
  return Buffer(static_cast<std::byte*>(p));
}

void HostBlockIo::give_buffer(Buffer buffer) {
  std::lock_guard lock(_idle_mutex);
  if ((_idle.size() + 1) * _slot_bytes <= kKeptBytes) _idle.push_back(std::move(buffer));
}

template <class One>
void HostBlockIo::for_each_block(std::span<BlockRequest> batch, bool bounces, std::size_t in_flight,
                                 One&& one) {
  if (batch.empty()) return;
  std::size_t threads = std::min(in_flight, batch.size());
  if (bounces)
    threads =
        std::min<std::size_t>(threads, std::max<std::uint64_t>(1, kBounceBytes / _slot_bytes));
  auto state = std::make_shared<Batch>(batch.size());
  // Each block's outcome is set whatever happens; a pool thread gives its buffer back before
  // the block that lets the caller return is counted, so it never touches `this` after.
  const auto work = [this, state, batch, &one] {
    Buffer buffer;
    const std::function<std::byte*()> bounce = [&] {
      if (!buffer) buffer = take_buffer();
      return buffer.get();
    };
    for (std::size_t i = state->next.fetch_add(1); i < state->size;) {
      try {
        one(batch[i], bounce);
      } catch (const std::exception& e) {  // no bounce memory: this block fails alone
        batch[i].outcome = BlockOutcome::io_error;
        batch[i].message = concat(_slabs.name(batch[i].slab), ": block at offset ", batch[i].offset,
                                  " was not moved: ", e.what());
      }
      const std::size_t j = state->next.fetch_add(1);
      if (j >= state->size && buffer) give_buffer(std::move(buffer));
      state->finish_one();
      i = j;
    }
  };
  if (threads > 1) {
    WorkerPool& pool = transfer_workers();
    pool.reserve(static_cast<unsigned>(threads - 1));
    pool.post(work, static_cast<unsigned>(threads - 1));
  }
  work();
  std::unique_lock lock(state->mutex);
  state->done.wait(lock, [&] { return state->finished == state->size; });
}

void HostBlockIo::write_one(BlockRequest& request, const std::function<std::byte*()>& bounce) {
  const std::uint64_t length = total(request.pieces);
  FERRY_ASSERT(length <= _slot_bytes);
  for (const BlockSpan& piece : request.pieces) FERRY_ASSERT(!piece.device.is_cuda());
  request.route = KVRoute::host;
  int error = 0;
  if (!_slabs.direct(request.slab)) {
    // Through the page cache: straight from the pieces; the sync makes them durable.
    add_route_reason(request,
                     "host memory: one buffered write from its pieces (the slab refuses O_DIRECT)");
    request.checksum = block_checksum(request.pieces);
    error = transfer_pieces<true>(_slabs, request.slab, request.pieces, request.offset);
  } else if (DirectSplit split; split_direct(request, split)) {
    add_route_reason(request, direct_reason(split, "write straight from"));
    request.checksum = block_checksum(request.pieces);
    alignas(kAlign) std::byte page[kAlign] = {};  // the last partial page, zero-padded
    if (split.tail.size > 0) std::memcpy(page, split.tail.data, split.tail.size);
    error = transfer_pieces<true>(_slabs, request.slab, with_tail_page(split, page),
                                  request.offset, true);
  } else {
    add_route_reason(request,
                     "host memory: gathered into a 4 KiB-aligned bounce buffer (its pieces "
                     "are not page-aligned), one O_DIRECT write");
    std::byte* buffer = bounce();
    std::byte* at = buffer;
    for (const BlockSpan& piece : request.pieces) {
      if (piece.size == 0) continue;
      std::memcpy(at, piece.data, piece.size);
      at += piece.size;
    }
    const std::uint64_t padded = round_up(length);
    std::memset(at, 0, padded - length);
    request.checksum = checksum(buffer, length);
    error = transfer<true>(_slabs, request.slab, buffer, padded, request.offset);
  }
  if (error != 0)
    fail_request(request, _slabs, error, "write of a block");
  else
    request.outcome = BlockOutcome::ok;
}

void HostBlockIo::read_one(BlockRequest& request, bool cached,
                           const std::function<std::byte*()>& bounce) {
  const std::uint64_t length = total(request.pieces);
  FERRY_ASSERT(length <= _slot_bytes);
  for (const BlockSpan& piece : request.pieces) FERRY_ASSERT(!piece.device.is_cuda());
  request.route = KVRoute::host;
  if (!_slabs.direct(request.slab) || cached) {
    // From the page cache (or a slab that refuses O_DIRECT): straight into the pieces.
    add_route_reason(request,
                     cached ? "host memory: in the page cache, one buffered read into its pieces"
                            : "host memory: one buffered read (the slab refuses O_DIRECT)");
    if (const int error =
            transfer_pieces<false>(_slabs, request.slab, request.pieces, request.offset))
      return fail_request(request, _slabs, error, "read of a block");
    if (block_checksum(request.pieces) != request.checksum) return mismatch(request, _slabs);
  } else if (DirectSplit split; split_direct(request, split)) {
    add_route_reason(request, direct_reason(split, "read straight into"));
    alignas(kAlign) std::byte page[kAlign];  // the last partial page
    if (const int error = transfer_pieces<false>(_slabs, request.slab,
                                                 with_tail_page(split, page), request.offset, true))
      return fail_request(request, _slabs, error, "read of a block");
    // Checked before the tail is copied out: a block that is all tail never reaches the caller.
    StreamingHash hash;
    for (const BlockSpan& p : split.body) hash.update(p.data, p.size);
    hash.update(page, split.tail.size);
    if (hash.digest() != request.checksum) return mismatch(request, _slabs);
    if (split.tail.size > 0) std::memcpy(split.tail.data, page, split.tail.size);
  } else {
    add_route_reason(request,
                     "host memory: one O_DIRECT read into a 4 KiB-aligned bounce buffer (its "
                     "pieces are not page-aligned), checked there, then copied out");
    std::byte* buffer = bounce();
    if (const int error =
            transfer<false>(_slabs, request.slab, buffer, round_up(length), request.offset))
      return fail_request(request, _slabs, error, "read of a block");
    if (checksum(buffer, length) != request.checksum) return mismatch(request, _slabs);
    const std::byte* from = buffer;
    for (const BlockSpan& p : request.pieces) {
      if (p.size == 0) continue;
      std::memcpy(p.data, from, p.size);
      from += p.size;
    }
  }
  request.outcome = BlockOutcome::ok;
}

void HostBlockIo::write(std::span<BlockRequest> batch, void*) {
  bool bounces = false;
  for (const BlockRequest& r : batch) bounces = bounces || !straight(r);
  // A fleet's writers share the storage: together they keep one writer's writes in flight.
  const std::size_t in_flight = std::max(kMinSharedWrites, kMaxInFlight / _writers.load());
  for_each_block(batch, bounces, in_flight,
                 [&](BlockRequest& request, const auto& bounce) { write_one(request, bounce); });
}

void HostBlockIo::read(std::span<BlockRequest> batch) {
  bool bounces = false;
  for (const BlockRequest& r : batch) bounces = bounces || !straight(r);
  // Which blocks the page cache holds, probed for the batch at once.
  std::vector<SlabFiles::Range> ranges(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i)
    ranges[i] = {batch[i].slab, batch[i].offset, total(batch[i].pieces)};
  const std::vector<bool> cached = _slabs.cached(ranges);
  for_each_block(batch, bounces, kMaxInFlight, [&](BlockRequest& request, const auto& bounce) {
    read_one(request, cached[static_cast<std::size_t>(&request - batch.data())], bounce);
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
