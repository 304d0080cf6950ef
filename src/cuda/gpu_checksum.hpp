// The KV store's block checksum (XXH3-64, kv/checksum.hpp) computed by the GPU that holds the
// blocks: the gains of every 1 KiB of every block summed in parallel, then 8 threads per block
// run its scrambles in order (xxh3_lanes.hpp), so a few large blocks fill the GPU as many small
// ones do. It checks the bytes where
// they landed, whatever path brought them (a DMA the CPU never saw included).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "shim/cuda_driver.hpp"

namespace ferry::detail {

struct DeviceBytes {
  shim::cu::DevicePtr data = 0;
  std::uint64_t size = 0;
};

// Why the GPU checksum cannot run on device `ordinal` in this process ("" where it can): a build
// without nvcc has no kernel, a driver may lack the module calls or refuse the PTX.
std::string gpu_checksum_unavailable(int ordinal);

// XXH3-64 of each range (all in device `ordinal`'s memory, at most 2^32 - 1 of them), computed
// on that GPU in order on `stream`, after the work queued there; returns once they are known.
// Throws CudaError where it cannot run (see gpu_checksum_unavailable).
std::vector<std::uint64_t> gpu_checksums(int ordinal, std::span<const DeviceBytes> ranges,
                                         shim::cu::Stream stream);

// Device memory a caller keeps for the calls it makes on one stream of one device (grown as
// needed): a pipeline of calls then allocates nothing per call, and frees nothing (a free waits
// for the whole device, the other streams' copies included).
struct GpuChecksumScratch {
  std::shared_ptr<void> memory;
  std::uint64_t bytes = 0;
};
std::vector<std::uint64_t> gpu_checksums(int ordinal, std::span<const DeviceBytes> ranges,
                                         shim::cu::Stream stream, GpuChecksumScratch& scratch);

// A device-to-device copy made only where range `block`'s digest equals its expected one.
struct MatchedCopy {
  shim::cu::DevicePtr from = 0, to = 0;
  std::uint64_t size = 0;
  std::uint64_t block = 0;
};
// Queues the checksums on `stream` and returns at once (a pipeline of them waits for nothing):
// the digests land in `digests` (one per range, in pinned host memory) once the stream has passed
// this point; the caller keeps `scratch` and `digests` until then. Then, on the same stream, the
// copies whose range matched `expected` (one digest per range), decided on the GPU: per-layer
// pieces scattered out of a bounce buffer only once their block is known good, with no round
// trip through the host. `checksums_queued` (may be empty) runs between queuing the checksums
// and the copies, e.g. to record an event.
void queue_gpu_checksums(int ordinal, std::span<const DeviceBytes> ranges,
                         shim::cu::Stream stream, GpuChecksumScratch& scratch,
                         std::uint64_t* digests, std::span<const std::uint64_t> expected = {},
                         std::span<const MatchedCopy> copies = {},
                         const std::function<void()>& checksums_queued = {});

}  // namespace ferry::detail
