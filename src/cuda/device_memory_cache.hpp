// The opt-in device memory cache (LoadOptions::cache_device_memory): destinations of loads come
// from one stream-ordered memory pool per device (cuMemPoolCreate) that keeps what is freed for
// the next load instead of handing it back to the driver. Freeing a large allocation back to the
// driver makes it do work that slows the next ~tens of ms of host-to-device copies by ~8%
// (measured: pinned H2D right after a 1.2 GB cuMemFree), which a process that frees one load right
// before the next pays on every load. The cache holds freed memory from every other allocator
// (PyTorch's included) until release_cached_device_memory(), so it is off by default.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "cuda/cuda_resources.hpp"

namespace ferry::detail {

// `bytes` of device memory in `context` from the device's pool, handed back to the pool (not to
// the driver) when the last reference goes. As cuMemFree does, the hand-back first waits for the
// work queued on the device, so no kernel still reading it sees a later load's bytes. Throws
// CudaError where the driver or device has no memory pools (the message says so).
std::shared_ptr<void> allocate_cached_device_memory(std::shared_ptr<PrimaryContext> context,
                                                    std::size_t bytes);

// Hands the memory the pools keep, and no allocation holds, back to the driver. Returns the
// bytes the pools still hold (those of allocations alive).
std::uint64_t trim_device_memory_caches();

// Bytes the pools hold now, free or in use (0 where no pool was made).
std::uint64_t device_memory_cache_bytes();

}  // namespace ferry::detail
