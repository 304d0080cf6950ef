// A load's set-up made ahead, on a thread of its own. A server loads its weights once per
// process, so its one load is a first load, which otherwise pins its staging, starts its threads
// and makes its copy streams while it reads. Started while the server builds its model (vLLM's
// loader does), the load then runs as fast as a later one.
#pragma once

#include <future>
#include <memory>

#include "ferry/checkpoint.hpp"
#include "ferry/load_options.hpp"
#include "ferry/transfer.hpp"

namespace ferry {

class LoadPreparation {
 public:
  LoadPreparation() = default;  // nothing under way
  // Starts warm_up (transfer.hpp) for loads with these options (device, threads, chunk_bytes,
  // slots, staging_bytes, copy_streams: the settings a load with them would choose).
  explicit LoadPreparation(const LoadOptions& options);
  // The same, and with options.page_cache_pin_bytes, the checkpoint's files wholly in the page
  // cache registered for page-cache DMA (a server knows its checkpoint long before it loads).
  LoadPreparation(const LoadOptions& options, std::shared_ptr<const Checkpoint> checkpoint);
  LoadPreparation(LoadPreparation&&) noexcept = default;
  LoadPreparation& operator=(LoadPreparation&&) noexcept = default;
  ~LoadPreparation();  // waits for the thread

  bool started() const noexcept { return _report.valid(); }
  bool done() const;
  // Waits; the report, or what the warm-up failed with (CudaError, std::invalid_argument).
  // Throws std::logic_error where none was started.
  WarmUpReport wait() const;

 private:
  std::shared_future<WarmUpReport> _report;
};

}  // namespace ferry
