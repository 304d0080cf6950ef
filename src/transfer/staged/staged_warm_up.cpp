// warm_up (transfer.hpp): a first submission's set-up, made before it is needed.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "cuda/cuda_resources.hpp"
#include "ferry/error.hpp"
#include "ferry/transfer.hpp"
#include "ferry/utf8_path.hpp"
#include "services/copier.hpp"
#include "services/page_cache_registry.hpp"
#include "services/pinned_pool.hpp"
#include "services/worker_pool.hpp"
#include "shim/cuda_driver.hpp"
#include "transfer/staged/staged_settings.hpp"

namespace ferry {
namespace {

// Each file's registration made and left in the process's registry (the lease dropped at once:
// an idle registration stays until the budget needs its room), as the submission would make it.
void register_page_cache(const Device& device, const FileSet& files, std::uint64_t budget,
                         WarmUpReport& report) {
  detail::PageCacheRegistry& registry = detail::page_cache_registry();
  if (!registry.serves(device)) {
    report.page_cache_why_not = detail::concat(
        "page-cache DMA (", registry.registrar_name(), ") does not serve ", device.to_string());
    return;
  }
  for (std::uint32_t f = 0; f < files.size(); ++f) {
    std::string why_not;
    try {
      auto got = registry.acquire(*files.acquire(f, false), budget);
      report.page_cache_bytes += got.lease ? got.lease.size() : 0;
      why_not = std::move(got.why_not);
    } catch (const std::exception& e) {  // reopening it failed: the load will say so again
      why_not = e.what();
    }
    if (!why_not.empty() && report.page_cache_why_not.empty())
      report.page_cache_why_not = detail::concat(utf8_of(files.path(f)), ": ", why_not);
  }
}

}  // namespace

WarmUpReport warm_up(const Device& device, const TransferOptions& options,
                     const FileSet* files) {
  const auto started = std::chrono::steady_clock::now();
  const detail::StagedSettings s =
      detail::fit_staging(options, Direction::FileToMemory, detail::wanted_settings(options));
  const detail::PrimaryContext* context = nullptr;
  if (device.is_cuda()) {
    FERRY_EXPECT(cuda_available(), CudaError, "warm-up for ", device.to_string(),
                 ": no CUDA driver is usable here: ",
                 shim::CudaDriver::get().why_unusable);
    context = &detail::device_context(device.index);
  }
  WarmUpReport report;
  const std::uint64_t slot = detail::slot_bytes(s.chunk, Direction::FileToMemory);
  report.slabs = detail::staging_pool().prefill(slot, s.slots, s.threads, context);
  report.staging_bytes = std::uint64_t{report.slabs} * s.slots * slot;  // slot: whole pages
  report.pinned = context != nullptr && report.slabs > 0;
  report.threads = detail::transfer_workers().reserve(s.threads);
  if (context) {
    // One copier per worker, made and dropped: their streams and fences go back to the
    // process's pools, where the submission's copiers take them.
    context->make_current();
    std::vector<std::unique_ptr<detail::Copier>> copiers;
    const unsigned streams = options.copy_streams ? options.copy_streams : s.threads;
    for (unsigned i = 0; i < streams; ++i)
      copiers.push_back(detail::make_copier(device, s.slots));
    report.streams = streams;
  }
  if (files && options.page_cache_pin_bytes > 0)
    register_page_cache(device, *files, options.page_cache_pin_bytes, report);
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return report;
}

}  // namespace ferry
