// Many device-to-device copies in ONE kernel launch (ferry_copy_matched with no digests): the
// gather of a KV block's per-layer pieces into a contiguous run of a bounce buffer before its
// large copies out, and the scatter of a verified run back into the pieces after its copies in.
// One launch from a device-side table instead of one cuMemcpy per piece (64 pieces of 32 KiB
// per block are vLLM's paged KV cache: per-call costs, not bytes, bound those copies).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "shim/cuda_driver.hpp"

namespace ferry::detail {

struct DeviceCopy {
  shim::cu::DevicePtr from = 0, to = 0;
  std::uint64_t size = 0;
};

// Device memory for the copy table, kept by the caller per stream (grown as needed).
struct DeviceCopyScratch {
  std::shared_ptr<void> memory;
  std::uint64_t bytes = 0;
};

// Queues the copies (all within device `ordinal`'s memory) on `stream` after the work queued
// there: the table is uploaded and the kernel launched; returns at once. `scratch` must stay
// until the stream has passed this point. Throws CudaError where ferry's kernels cannot run
// (device_kernels_unavailable says why).
void queue_device_copies(int ordinal, std::span<const DeviceCopy> copies, shim::cu::Stream stream,
                         DeviceCopyScratch& scratch);

// Copies in parts (a KV block's pieces each) uploaded as one table, each part launched on its own
// once its bytes are ready: a get's blocks scattered as they land, not after the whole call.
struct DeviceCopyParts {
  shim::cu::Function kernel = nullptr;  // looked up once: a launch per block takes no lookup
  shim::cu::DevicePtr table = 0;
  struct Part {
    std::uint32_t first = 0, count = 0;  // its rows of the table
    std::uint32_t slices = 0;            // its launch's grid
  };
  std::vector<Part> parts;
};

// Uploads `parts` (all within device `ordinal`'s memory) into `scratch` on `stream`; work queued
// there before may still read `scratch`'s old table only where it has to grow (then the stream
// is synchronized first). Throws CudaError where ferry's kernels cannot run.
DeviceCopyParts upload_copy_parts(int ordinal, std::span<const std::vector<DeviceCopy>> parts,
                                  shim::cu::Stream stream, DeviceCopyScratch& scratch);

// Queues part `k`'s copies (none where it has no bytes) on `stream`, one launch.
void queue_copy_part(const DeviceCopyParts& parts, std::size_t k, shim::cu::Stream stream);

}  // namespace ferry::detail
