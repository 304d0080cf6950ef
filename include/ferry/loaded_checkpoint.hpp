// Loading a checkpoint, and the result: every tensor's address in destination memory.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ferry/checkpoint.hpp"
#include "ferry/load_options.hpp"
#include "ferry/load_stats.hpp"
#include "ferry/transfer.hpp"

namespace ferry {

struct LoadedTensor {
  const TensorInfo* info = nullptr;
  // Host pointer for cpu, device address for cuda. 256-byte aligned in ferry's allocation.
  void* data = nullptr;
};

class PendingLoad;

// Owns the checkpoint description and the one destination allocation. The memory stays valid
// while any copy of memory() is held, so views can outlive this object safely.
class LoadedCheckpoint {
 public:
  const Checkpoint& checkpoint() const noexcept { return *_checkpoint; }
  const Device& device() const noexcept { return _device; }
  const LoadStats& stats() const noexcept { return _stats; }
  const std::vector<LoadedTensor>& tensors() const noexcept { return _tensors; }
  const LoadedTensor* find(std::string_view name) const;
  const std::shared_ptr<void>& memory() const noexcept { return _memory; }

 private:
  friend class PendingLoad;
  friend PendingLoad start_load(std::shared_ptr<const Checkpoint>, const LoadOptions&);
  std::shared_ptr<const Checkpoint> _checkpoint;
  Device _device;
  std::shared_ptr<void> _memory;
  std::vector<LoadedTensor> _tensors;
  std::unordered_map<std::string, std::size_t> _by_name;
  LoadStats _stats;
};

// A load under way (start_load): its allocation is made and every tensor's address is final,
// so views of them can be built while the bytes land (Python builds its tensors then); they hold
// the checkpoint's bytes once wait() has returned.
class PendingLoad {
 public:
  PendingLoad(PendingLoad&&) noexcept = default;
  PendingLoad& operator=(PendingLoad&&) = delete;
  // A load never waited for is cancelled; its copies stop before the memory can go.
  ~PendingLoad();

  const LoadedCheckpoint& loaded() const noexcept { return _loaded; }
  // Until every byte landed (polling options.keep_going); rethrows the first failure, or
  // ferry::Cancelled. Once: the result moves out (a second call throws std::logic_error).
  LoadedCheckpoint wait();

 private:
  friend PendingLoad start_load(std::shared_ptr<const Checkpoint>, const LoadOptions&);
  PendingLoad() = default;
  LoadedCheckpoint _loaded;
  LoadOptions _options;
  std::string _settings_source;
  std::chrono::steady_clock::time_point _started, _submitting;
  bool _waited = false;
  Ticket _ticket;  // last: destroyed (waited for) before the memory above
};

// Plans, allocates and submits a load into one new allocation on options.device, and returns
// while the bytes are read: throws what load() throws before its reads (bad options, no memory).
PendingLoad start_load(std::shared_ptr<const Checkpoint> checkpoint, const LoadOptions& options);

// Loads into one new allocation on options.device: start_load(...).wait().
LoadedCheckpoint load(std::shared_ptr<const Checkpoint> checkpoint, const LoadOptions& options);

// Frees the staging memory ferry keeps between loads (pinned for GPU loads; at most the
// staging_bytes of the largest load). The next load allocates it again.
void release_staging_memory();

// Hands back to the driver the device memory the device memory cache keeps for later loads
// (LoadOptions::cache_device_memory); the memory of loads still alive stays. Returns the bytes the
// cache still holds (theirs). 0 and nothing done where no load used the cache.
std::uint64_t release_cached_device_memory();

// A caller-owned destination for one tensor: `capacity` bytes at `data` on options.device.
struct TensorDestination {
  std::string name;
  void* data = nullptr;
  std::uint64_t capacity = 0;
};

// Loads the named tensors into memory the caller owns (options.names is ignored). Throws
// std::invalid_argument for an unknown name, a duplicate or a destination that is too small.
LoadStats load_into(const Checkpoint& checkpoint, std::span<const TensorDestination> destinations,
                    const LoadOptions& options);

}  // namespace ferry
