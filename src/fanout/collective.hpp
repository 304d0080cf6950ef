// How a multi-device load moves bytes between ranks: an in-place all-gather of replicated bytes
// over the ranks' allocations, and scatters that cut a tensor read whole on one rank into every
// rank's slice. GPUs (one process driving them all): NCCL all-gathers and peer-to-peer 2-D copies
// over NVLink (peer access enabled between every pair), each rank's on a stream of its own. Host
// memory (tests, and the same code path without a GPU): memcpy.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "ferry/device.hpp"

namespace ferry::detail {

class Collective {
 public:
  virtual ~Collective() = default;
  // Queues: for every rank r, bytes [offset + r * bytes_per_rank, + bytes_per_rank) of bases[r]
  // go to the same place of every other rank. Runs after the ranks' earlier copies landed (the
  // caller waited for them), on streams of its own; returns before it finishes.
  virtual void all_gather(std::span<void* const> bases, std::uint64_t offset,
                          std::uint64_t bytes_per_rank) = 0;
  // One rank's slice of a scatter: of each row, `width` bytes from `row_begin`, packed at `dst`.
  struct Slice {
    unsigned rank = 0;
    void* dst = nullptr;
    std::uint64_t row_begin = 0;
    std::uint64_t width = 0;
  };
  // Queues, after the reader's earlier copies landed: `rows` rows of `row_bytes` at `src` on rank
  // `reader`, cut into each slice.
  virtual void scatter(unsigned reader, const void* src, std::uint64_t rows,
                       std::uint64_t row_bytes, std::span<const Slice> slices) = 0;
  // Later collectives of rank `rank` start only once `cu_event` (a CUevent recorded behind that
  // rank's direct copies from a registered mapping) fired: waited on the device, no host sync.
  // Host memory: a no-op (those copies already ran).
  virtual void after(unsigned rank, void* cu_event) = 0;
  // A CUevent behind everything queued so far on rank `rank`'s stream (its scatters), valid for
  // the collective's life; null for host memory, where everything queued already ran.
  virtual void* mark(unsigned rank) = 0;
  // Until everything queued finished; throws CudaError where a collective failed.
  virtual void wait() = 0;
  // Device time spent in collectives so far (from the first queued to the last finished of each).
  virtual double busy_seconds() const = 0;
  virtual std::string name() const = 0;
};

// Host memory: each all_gather copies at once.
std::unique_ptr<Collective> host_collective(unsigned ranks);

// NCCL over distinct GPUs, one communicator per device set kept for the life of the process
// (made once with ncclCommInitAll: a later load pays nothing). Throws CudaError where NCCL cannot
// be found or started, naming where it was looked for.
std::unique_ptr<Collective> nccl_collective(std::span<const Device> devices);

// Seconds the first nccl_collective for a device set took to start NCCL (0 when reused).
double last_collective_setup_seconds();

}  // namespace ferry::detail
