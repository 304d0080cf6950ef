#include "cuda/device_copies.hpp"

#include <vector>

#include "cuda/cuda_resources.hpp"
#include "cuda/device_kernels.hpp"
#include "cuda/matched_copy_job.hpp"
#include "ferry/error.hpp"

namespace ferry::detail {
namespace {

constexpr unsigned kCopyThreads = kMatchedCopyThreads;
constexpr std::uint64_t kSliceBytes = kMatchedCopySliceBytes;
using CopyJob = MatchedCopyJob;

}  // namespace

void queue_device_copies(int ordinal, std::span<const DeviceCopy> copies, shim::cu::Stream stream,
                         DeviceCopyScratch& scratch) {
  std::vector<CopyJob> jobs;
  jobs.reserve(copies.size());
  std::uint64_t slices = 0;
  for (const DeviceCopy& c : copies) {
    if (c.size == 0) continue;
    jobs.push_back({c.from, c.to, c.size, 0, slices});
    slices += (c.size + kSliceBytes - 1) / kSliceBytes;
  }
  if (jobs.empty()) return;
  FERRY_EXPECT(jobs.size() < (1ull << 32) && slices < (1ull << 31), std::invalid_argument,
               jobs.size(), " device copies of ", slices,
               " slices of 64 KiB in one launch; at most 2^32 - 1 and 2^31 - 1");
  const shim::cu::Function kernel = device_kernel(ordinal, "ferry_copy_matched");
  device_context(ordinal).make_current();
  const std::uint64_t need = jobs.size() * sizeof(CopyJob);
  if (scratch.bytes < need) {
    FERRY_CU(cuStreamSynchronize, stream);  // a launch queued before still reads the old table
    scratch.memory.reset();
    scratch.memory = allocate_device_memory(std::make_shared<PrimaryContext>(ordinal), need);
    scratch.bytes = need;
  }
  auto table = reinterpret_cast<shim::cu::DevicePtr>(scratch.memory.get());
  // From pageable memory: the driver has taken the bytes when this returns.
  FERRY_CU(cuMemcpyHtoDAsync, table, jobs.data(), need, stream);
  auto count = static_cast<unsigned>(jobs.size());
  shim::cu::DevicePtr no_digests = 0;
  void* params[] = {&table, &count, &no_digests, &no_digests};
  FERRY_CU(cuLaunchKernel, kernel, static_cast<unsigned>(slices), 1, 1, kCopyThreads, 1, 1, 0,
           stream, params, nullptr);
}

}  // namespace ferry::detail
