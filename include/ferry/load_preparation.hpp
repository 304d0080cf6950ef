// A load's set-up made ahead, on a thread of its own. A server loads its weights once per
// process, so its one load is a first load, which otherwise pins its staging, starts its threads
// and makes its copy streams while it reads. Started while the server builds its model (vLLM's
// loader does), the load then runs as fast as a later one.
#pragma once

#include <future>

#include "ferry/load_options.hpp"
#include "ferry/transfer.hpp"

namespace ferry {

class LoadPreparation {
 public:
  LoadPreparation() = default;  // nothing under way
  // Starts warm_up (transfer.hpp) for loads with these options (device, threads, chunk_bytes,
  // slots, staging_bytes, copy_streams: the settings a load with them would choose).
  explicit LoadPreparation(const LoadOptions& options);
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
