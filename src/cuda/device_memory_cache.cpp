#include "cuda/device_memory_cache.hpp"

#include <cstdint>
#include <map>
#include <mutex>

#include "ferry/error.hpp"

namespace ferry::detail {
namespace {

// One device's pool, and the stream its allocations and hand-backs are ordered on (a hand-back
// and the next allocation on one stream reuse memory with no event between them).
struct DevicePool {
  shim::cu::MemoryPool pool = nullptr;
  Stream stream;
};

struct Pools {
  std::mutex mutex;
  std::map<int, std::unique_ptr<DevicePool>> by_device;
};

// Leaked on purpose, as the primary contexts are: no CUDA call from a static destructor.
Pools& pools() {
  static auto* p = new Pools;
  return *p;
}

DevicePool& pool_for(const PrimaryContext& context) {
  Pools& all = pools();
  std::lock_guard lock(all.mutex);
  auto& slot = all.by_device[context.ordinal()];
  if (slot) return *slot;
  const auto& d = shim::CudaDriver::get();
  FERRY_EXPECT(d.cuMemPoolCreate && d.cuMemPoolSetAttribute && d.cuMemPoolGetAttribute &&
                   d.cuMemPoolTrimTo && d.cuMemAllocFromPoolAsync && d.cuMemFreeAsync &&
                   d.cuCtxSynchronize,
               CudaError,
               "cache_device_memory needs stream-ordered memory pools (cuMemPoolCreate), which "
               "this CUDA driver lacks (CUDA 11.2 or later has them)");
  shim::cu::Device device = 0;
  FERRY_CU(cuDeviceGet, &device, context.ordinal());
  int supported = 0;
  FERRY_CU(cuDeviceGetAttribute, &supported, shim::cu::kAttributeMemoryPoolsSupported, device);
  FERRY_EXPECT(supported != 0, CudaError, "cache_device_memory: cuda:", context.ordinal(),
               " does not support stream-ordered memory pools");
  context.make_current();
  auto made = std::make_unique<DevicePool>();
  shim::cu::MemPoolProps props{};
  props.allocType = shim::cu::kMemAllocationTypePinned;
  props.location.type = shim::cu::kMemLocationTypeDevice;
  props.location.id = context.ordinal();
  FERRY_CU(cuMemPoolCreate, &made->pool, &props);
  // Keep everything freed into the pool until trimmed: that is the cache.
  std::uint64_t keep_all = UINT64_MAX;
  FERRY_CU(cuMemPoolSetAttribute, made->pool, shim::cu::kMemPoolAttrReleaseThreshold, &keep_all);
  slot = std::move(made);
  return *slot;
}

std::uint64_t reserved_bytes(shim::cu::MemoryPool pool) {
  std::uint64_t bytes = 0;
  FERRY_CU(cuMemPoolGetAttribute, pool, shim::cu::kMemPoolAttrReservedMemCurrent, &bytes);
  return bytes;
}

}  // namespace

std::shared_ptr<void> allocate_cached_device_memory(std::shared_ptr<PrimaryContext> context,
                                                    std::size_t bytes) {
  DevicePool& pool = pool_for(*context);
  context->make_current();
  shim::cu::DevicePtr ptr = 0;
  FERRY_CU(cuMemAllocFromPoolAsync, &ptr, bytes == 0 ? 1 : bytes, pool.pool, pool.stream.get());
  // Ready before other streams copy into it (the allocation is ordered on the pool's stream).
  try {
    pool.stream.synchronize();
  } catch (...) {
    shim::CudaDriver::get().cuMemFreeAsync(ptr, pool.stream.get());
    throw;
  }
  return std::shared_ptr<void>(reinterpret_cast<void*>(ptr), [context, &pool](void* p) noexcept {
    // The freeing thread may have no current context; a failure here can only leak.
    try {
      context->make_current();
      const auto& d = shim::CudaDriver::get();
      d.cuCtxSynchronize();
      d.cuMemFreeAsync(reinterpret_cast<shim::cu::DevicePtr>(p), pool.stream.get());
    } catch (...) {
    }
  });
}

std::uint64_t trim_device_memory_caches() {
  Pools& all = pools();
  std::lock_guard lock(all.mutex);
  std::uint64_t held = 0;
  for (auto& [ordinal, pool] : all.by_device) {
    device_context(ordinal).make_current();
    // Hand-backs queued on the pool's stream reach the pool first.
    pool->stream.synchronize();
    FERRY_CU(cuMemPoolTrimTo, pool->pool, 0);
    held += reserved_bytes(pool->pool);
  }
  return held;
}

std::uint64_t device_memory_cache_bytes() {
  Pools& all = pools();
  std::lock_guard lock(all.mutex);
  std::uint64_t held = 0;
  for (auto& [ordinal, pool] : all.by_device) {
    device_context(ordinal).make_current();
    held += reserved_bytes(pool->pool);
  }
  return held;
}

}  // namespace ferry::detail
