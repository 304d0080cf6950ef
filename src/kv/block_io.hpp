// The one seam through which the KV store moves block bytes. Everything above it (index,
// journal, eviction) is storage logic; everything below it is data movement. A batch of N
// blocks is one call, shaped for the transfer core's submit-a-batch-get-a-ticket model: today
// HostBlockIo serves host memory with positioned O_DIRECT I/O; TransferBlockIo serves cuda:N
// pieces through the transfer core (staged or cuFile) and hands host blocks to HostBlockIo.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "ferry/device.hpp"
#include "ferry/kv_store.hpp"

namespace ferry::detail::kv {

// A piece as the caller gave it: blocks move straight from the caller's pieces, not copies.
using BlockSpan = KVPiece;

enum class BlockOutcome { ok, io_error, checksum_mismatch, unsupported };

// One block: a slot of a slab file and the memory pieces it is gathered from or scattered to.
struct BlockRequest {
  int slab = 0;
  std::uint64_t offset = 0;  // 4 KiB-aligned
  std::span<const BlockSpan> pieces;
  // write: filled with the XXH3-64 of the bytes written; read: the checksum they must have.
  std::uint64_t checksum = 0;
  BlockOutcome outcome = BlockOutcome::ok;
  std::string message;  // names the file and the failure where outcome != ok
  KVRoute route = KVRoute::none;  // the path the bytes took (set by write/read)
  std::string route_reason;       // why (page-cache DMA on: why it did or did not serve it)
};

// The block's bytes: its pieces' sizes added up.
inline std::uint64_t request_bytes(const BlockRequest& r) {
  std::uint64_t sum = 0;
  for (const BlockSpan& p : r.pieces) sum += p.size;
  return sum;
}

// Adds `why` to the block's reason for its route (page-cache DMA may have said already why it
// did not serve the block).
inline void add_route_reason(BlockRequest& r, const std::string& why) {
  r.route_reason = r.route_reason.empty() ? why : r.route_reason + "; " + why;
}

// What page-cache DMA did so far (kv/page_cache_gets.hpp); zeros where it is off.
struct PageCacheCounters {
  std::uint64_t bytes = 0;          // copied from registered windows (verified)
  std::uint64_t registered = 0;     // windows registered
  double register_seconds = 0;      // mapping, populating and registering them
  std::uint64_t pending = 0;        // windows queued or being registered in the background
  std::uint64_t stale_rereads = 0;  // blocks re-read after a mismatch on the DMA path
  // Device time (the streams' events, summed over the chunks of each get: chunks on two
  // streams overlap, so these may add up to more than the gets' wall time): the copies out of
  // the page cache, the GPU checksums of what landed, the scatters of multi-piece blocks.
  double dma_seconds = 0, checksum_seconds = 0, scatter_seconds = 0;
};

// Thread-seconds of the staged path's workers, summed over its transfers (TransferStats).
struct StagedTimes {
  double io = 0, copy_wait = 0, queue = 0, hash = 0, hash_wait = 0;  // queue includes hash
  double setup = 0;  // staging leases and copy streams taken per job
  // The transfers' wall time (submit to the last worker's end), that times their workers (the
  // thread-seconds the workers had), and the copies they queued.
  double transfer = 0, span = 0;
  std::uint64_t copies = 0;
  // The calling thread's time around the transfers of a GPU batch: from its start to its first
  // submission (route, groups, bounce runs; a put's gathers), and from its last transfer's end
  // to its return (the last scatters, checks, outcomes).
  double lead = 0, tail = 0;
};

class BlockIo {
 public:
  virtual ~BlockIo() = default;
  // Each block's pieces are gathered into ONE write of the block; the checksum is taken of the
  // bytes as written. GPU memory is read only after `after_event` (a CUevent, or null) fires.
  // Failures are per block.
  virtual void write(std::span<BlockRequest> batch, void* after_event) = 0;
  // Each block is ONE read. Its checksum is verified in the bounce buffer where the bytes pass
  // through one (host or device), before any reaches the caller; a block read straight into the
  // caller's memory is verified there, so a mismatch may leave bytes in the destination (the
  // block is reported missing either way: bad bytes are never reported as a hit).
  virtual void read(std::span<BlockRequest> batch) = 0;
  // Makes every write to `slab` so far durable (fdatasync). Throws std::system_error.
  virtual void sync(int slab) = 0;
  // Whether slab I/O goes around the page cache (O_DIRECT) or, where refused, through it.
  virtual bool direct() const = 0;
  // The writers putting into this namespace's storage now, this one included (a fleet's): each
  // keeps its share of the writes in flight, so that together they keep what one writer does.
  virtual void share_writes(unsigned writers) { (void)writers; }
  // What the staged path's workers did so far; zeros where no transfer used it.
  virtual StagedTimes staged_times() const { return {}; }
  virtual PageCacheCounters page_cache_counters() const { return {}; }
};

}  // namespace ferry::detail::kv
