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

// `jobs` into `scratch` (grown where needed, after the stream's earlier work) on `stream`.
shim::cu::DevicePtr upload_table(int ordinal, const std::vector<CopyJob>& jobs,
                                 shim::cu::Stream stream, DeviceCopyScratch& scratch) {
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
  return table;
}

void launch(shim::cu::Function kernel, shim::cu::DevicePtr table, std::uint32_t count,
            std::uint64_t slices, shim::cu::Stream stream) {
  shim::cu::DevicePtr no_digests = 0;
  void* params[] = {&table, &count, &no_digests, &no_digests};
  FERRY_CU(cuLaunchKernel, kernel, static_cast<unsigned>(slices), 1, 1, kCopyThreads, 1, 1, 0,
           stream, params, nullptr);
}

void check_launch_shape(std::uint64_t copies, std::uint64_t slices) {
  FERRY_EXPECT(copies < (1ull << 32) && slices < (1ull << 31), std::invalid_argument, copies,
               " device copies of ", slices,
               " slices of 64 KiB in one launch; at most 2^32 - 1 and 2^31 - 1");
}

}  // namespace

DeviceCopyParts upload_copy_parts(int ordinal, std::span<const std::vector<DeviceCopy>> parts,
                                  shim::cu::Stream stream, DeviceCopyScratch& scratch) {
  DeviceCopyParts out;
  out.parts.resize(parts.size());
  std::vector<CopyJob> jobs;
  std::size_t rows = 0;
  for (const auto& part : parts) rows += part.size();
  jobs.reserve(rows);
  for (std::size_t k = 0; k < parts.size(); ++k) {
    DeviceCopyParts::Part& part = out.parts[k];
    part.first = static_cast<std::uint32_t>(jobs.size());
    std::uint64_t slices = 0;  // each part's rows count their slices from its own launch's first
    for (const DeviceCopy& c : parts[k]) {
      if (c.size == 0) continue;
      jobs.push_back({c.from, c.to, c.size, 0, slices});
      slices += (c.size + kSliceBytes - 1) / kSliceBytes;
    }
    check_launch_shape(jobs.size(), slices);
    part.count = static_cast<std::uint32_t>(jobs.size() - part.first);
    part.slices = static_cast<std::uint32_t>(slices);
  }
  if (!jobs.empty()) {
    out.kernel = device_kernel(ordinal, "ferry_copy_matched");  // throws here, not at a launch
    out.table = upload_table(ordinal, jobs, stream, scratch);
  }
  return out;
}

void queue_copy_part(const DeviceCopyParts& parts, std::size_t k, shim::cu::Stream stream) {
  const DeviceCopyParts::Part& part = parts.parts.at(k);
  if (part.count == 0) return;
  launch(parts.kernel, parts.table + part.first * sizeof(CopyJob), part.count, part.slices,
         stream);
}

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
  check_launch_shape(jobs.size(), slices);
  // Looked up before the upload: throws there where ferry's kernels cannot run.
  const shim::cu::Function kernel = device_kernel(ordinal, "ferry_copy_matched");
  const shim::cu::DevicePtr table = upload_table(ordinal, jobs, stream, scratch);
  launch(kernel, table, static_cast<std::uint32_t>(jobs.size()), slices, stream);
}

}  // namespace ferry::detail
