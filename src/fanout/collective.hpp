// The collective a multi-device load fans replicated bytes out with: an in-place all-gather over
// the ranks' allocations. NCCL for GPUs (one process driving them all), memcpy for host memory
// (tests, and the same code path without a GPU).
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
