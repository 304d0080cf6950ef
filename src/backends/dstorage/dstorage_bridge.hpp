// DirectStorage straight into a CUDA device (Windows): a D3D12 buffer on the adapter whose LUID
// is the CUDA device's, created shared and imported into CUDA as external memory, and a shared
// D3D12 fence imported as an external semaphore. DirectStorage reads into the buffer and signals
// the fence; the copy stream waits on the fence (cuWaitExternalSemaphoresAsync) and copies the
// bytes device to device into the destination: no host staging, no host sync on the data path.
// The bridge of each device is made once and kept for the life of the process (D3D12 and CUDA
// objects are never released from static destructors): a buffer of kBridgeBytes of GPU memory.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "shim/cuda_driver.hpp"

struct ID3D12Device;
struct ID3D12Resource;
struct ID3D12Fence;

namespace ferry::detail {

// Two halves: DirectStorage fills one while the copy stream empties the other.
inline constexpr std::uint64_t kBridgeHalfBytes = 64ull << 20;
inline constexpr std::uint64_t kBridgeBytes = 2 * kBridgeHalfBytes;

struct DirectStorageBridge {
  int ordinal = 0;
  std::string adapter;  // the D3D12 adapter's name, and why it is the CUDA device's
  ID3D12Device* device = nullptr;
  ID3D12Resource* buffer = nullptr;  // kBridgeBytes, shared, in the CUDA device's memory
  ID3D12Fence* fence = nullptr;      // shared; its values only grow
  shim::cu::ExternalMemory memory = nullptr;
  shim::cu::DevicePtr mapped = 0;  // the buffer as CUDA sees it
  shim::cu::ExternalSemaphore semaphore = nullptr;
  std::mutex mutex;               // one job at a time uses the bridge
  std::uint64_t fence_value = 0;  // the last value asked for (under `mutex`)
};

// cuda:`ordinal`'s bridge, or null with `error` naming the step that failed and why (the CUDA
// device's LUID, the matching adapter, d3d12.dll, the device, the shared buffer, its handle,
// CUDA's import and mapping, the shared fence, its handle, CUDA's import). Made at the first
// call; a failure is remembered, as the machine will not change.
DirectStorageBridge* directstorage_bridge(int ordinal, std::string& error);

// Brings the bridge's fence to at least `value` from the host: DirectStorage may never signal the
// value of a batch that failed, and the copy stream waiting on it must not wait for ever.
void release_fence(DirectStorageBridge& bridge, std::uint64_t value) noexcept;

}  // namespace ferry::detail
