#include "cuda/gpu_checksum.hpp"

#include <cstring>
#include <memory>

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

#include "cuda/cuda_resources.hpp"
#include "cuda/device_kernels.hpp"
#include "cuda/matched_copy_job.hpp"
#include "cuda/xxh3_lanes.hpp"
#include "ferry/error.hpp"

namespace ferry::detail {

namespace {

constexpr unsigned kGroupsPerCta = 32;  // ferry_xxh3_finish's: 8 threads per input
constexpr unsigned kFinishThreads = kGroupsPerCta * xxh3::kLanes;
constexpr unsigned kGainThreads = 256;     // ferry_xxh3_gains': a warp per segment
constexpr unsigned kBlocksPerSegment = 8;  // 1 KiB blocks per segment, xxh3_blocks.cu's

struct Job {  // xxh3_blocks.cu's, byte for byte
  std::uint64_t data;
  std::uint64_t size;
  std::uint64_t first_gain;
  std::uint64_t first_segment;
};

constexpr unsigned kCopyThreads = kMatchedCopyThreads;
constexpr std::uint64_t kSliceBytes = kMatchedCopySliceBytes;
using CopyJob = MatchedCopyJob;

const xxh3::Keys& default_keys() {
  static const xxh3::Keys keys = xxh3::make_keys(XXH3_kSecret);
  return keys;
}

}  // namespace

std::string gpu_checksum_unavailable(int ordinal) { return device_kernels_unavailable(ordinal); }

std::vector<std::uint64_t> gpu_checksums(int ordinal, std::span<const DeviceBytes> ranges,
                                         shim::cu::Stream stream) {
  GpuChecksumScratch scratch;
  return gpu_checksums(ordinal, ranges, stream, scratch);
}

namespace {

// Queues everything but the digests' way back; returns where they are on the device.
shim::cu::DevicePtr queue_on_device(int ordinal, std::span<const DeviceBytes> ranges,
                                    shim::cu::Stream stream, GpuChecksumScratch& scratch,
                                    std::span<const std::uint64_t> expected,
                                    std::span<const MatchedCopy> copies,
                                    const std::function<void()>& checksums_queued) {
  FERRY_EXPECT(ranges.size() < (1ull << 32), std::invalid_argument, ranges.size(),
               " ranges in one GPU checksum call; at most 2^32 - 1");
  FERRY_EXPECT(copies.empty() || expected.size() == ranges.size(), std::invalid_argument,
               "copies after a GPU checksum need one expected digest per range (", expected.size(),
               " for ", ranges.size(), ")");
  FERRY_EXPECT(copies.size() < (1ull << 32), std::invalid_argument, copies.size(),
               " copies in one GPU checksum call; at most 2^32 - 1");
  const shim::cu::Function gains_kernel = device_kernel(ordinal, "ferry_xxh3_gains");
  const shim::cu::Function finish_kernel = device_kernel(ordinal, "ferry_xxh3_finish");
  // Each input's full blocks get a row of 8 gains (64 bytes per KiB of input) and segments of
  // kBlocksPerSegment blocks, one warp each.
  std::vector<Job> jobs(ranges.size());
  std::uint64_t gain_rows = 0, segments = 0;
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const std::uint64_t size = ranges[i].size;
    const std::uint64_t blocks = size > xxh3::kMidSizeMax ? xxh3::scrambled_blocks(size) : 0;
    jobs[i] = {ranges[i].data, size, gain_rows, segments};
    gain_rows += blocks;
    segments += (blocks + kBlocksPerSegment - 1) / kBlocksPerSegment;
  }
  // Each copy is cut in slices, a CTA each.
  std::vector<CopyJob> copy_jobs(copies.size());
  std::uint64_t slices = 0;
  for (std::size_t i = 0; i < copies.size(); ++i) {
    const MatchedCopy& c = copies[i];
    FERRY_EXPECT(c.block < ranges.size(), std::invalid_argument, "a copy after a GPU checksum ",
                 "names range ", c.block, " of ", ranges.size());
    copy_jobs[i] = {c.from, c.to, c.size, c.block, slices};
    slices += (c.size + kSliceBytes - 1) / kSliceBytes;
  }
  FERRY_EXPECT(slices < (1ull << 31), std::invalid_argument, "copies of ", slices,
               " slices of 64 KiB after one GPU checksum call; fewer than 2^31");
  // Device scratch: gains (first: 16-byte stores, and the allocation's start is aligned), then
  // what the host uploads in one copy (jobs, expected digests, copies), then the digests.
  const std::uint64_t gain_bytes = gain_rows * xxh3::kLanes * sizeof(std::uint64_t);
  const std::uint64_t job_bytes = jobs.size() * sizeof(Job);
  const std::uint64_t expected_bytes = copies.empty() ? 0 : expected.size_bytes();
  const std::uint64_t copy_bytes = copy_jobs.size() * sizeof(CopyJob);
  std::vector<std::byte> upload(job_bytes + expected_bytes + copy_bytes);
  std::memcpy(upload.data(), jobs.data(), job_bytes);
  if (expected_bytes) std::memcpy(upload.data() + job_bytes, expected.data(), expected_bytes);
  if (copy_bytes)
    std::memcpy(upload.data() + job_bytes + expected_bytes, copy_jobs.data(), copy_bytes);
  device_context(ordinal).make_current();
  const std::uint64_t need = gain_bytes + upload.size() + ranges.size() * sizeof(std::uint64_t);
  if (scratch.bytes < need) {
    FERRY_CU(cuStreamSynchronize, stream);  // calls queued before on this stream still use it
    scratch.memory.reset();
    scratch.memory = allocate_device_memory(std::make_shared<PrimaryContext>(ordinal), need);
    scratch.bytes = need;
  }
  auto gains_on_gpu = reinterpret_cast<shim::cu::DevicePtr>(scratch.memory.get());
  shim::cu::DevicePtr jobs_on_gpu = gains_on_gpu + gain_bytes;
  shim::cu::DevicePtr expected_on_gpu = jobs_on_gpu + job_bytes;
  shim::cu::DevicePtr copies_on_gpu = expected_on_gpu + expected_bytes;
  shim::cu::DevicePtr digests_on_gpu = jobs_on_gpu + upload.size();
  FERRY_CU(cuMemcpyHtoDAsync, jobs_on_gpu, upload.data(), upload.size(), stream);
  auto count = static_cast<unsigned>(jobs.size());
  xxh3::Keys keys = default_keys();
  if (segments > 0) {
    const std::uint64_t ctas = (segments * 32 + kGainThreads - 1) / kGainThreads;
    FERRY_EXPECT(ctas < (1ull << 31), std::invalid_argument, gain_rows,
                 " KiB in one GPU checksum call; at most 2^37 KiB");
    void* params[] = {&jobs_on_gpu, &count, &segments, &keys, &gains_on_gpu};
    FERRY_CU(cuLaunchKernel, gains_kernel, static_cast<unsigned>(ctas), 1, 1, kGainThreads, 1, 1,
             0, stream, params, nullptr);
  }
  {
    void* params[] = {&jobs_on_gpu, &count, &keys, &gains_on_gpu, &digests_on_gpu};
    const unsigned ctas = (count + kGroupsPerCta - 1) / kGroupsPerCta;
    FERRY_CU(cuLaunchKernel, finish_kernel, ctas, 1, 1, kFinishThreads, 1, 1, 0, stream, params,
             nullptr);
  }
  if (checksums_queued) checksums_queued();
  if (slices > 0) {
    auto copy_count = static_cast<unsigned>(copy_jobs.size());
    void* params[] = {&copies_on_gpu, &copy_count, &digests_on_gpu, &expected_on_gpu};
    FERRY_CU(cuLaunchKernel, device_kernel(ordinal, "ferry_copy_matched"),
             static_cast<unsigned>(slices), 1, 1, kCopyThreads, 1, 1, 0, stream, params, nullptr);
  }
  return digests_on_gpu;
}

}  // namespace

std::vector<std::uint64_t> gpu_checksums(int ordinal, std::span<const DeviceBytes> ranges,
                                         shim::cu::Stream stream, GpuChecksumScratch& scratch) {
  std::vector<std::uint64_t> digests(ranges.size());
  if (ranges.empty()) return digests;
  const shim::cu::DevicePtr on_gpu =
      queue_on_device(ordinal, ranges, stream, scratch, {}, {}, {});
  FERRY_CU(cuMemcpyDtoHAsync, digests.data(), on_gpu, digests.size() * sizeof(std::uint64_t),
           stream);
  FERRY_CU(cuStreamSynchronize, stream);
  return digests;
}

void queue_gpu_checksums(int ordinal, std::span<const DeviceBytes> ranges,
                         shim::cu::Stream stream, GpuChecksumScratch& scratch,
                         std::uint64_t* digests, std::span<const std::uint64_t> expected,
                         std::span<const MatchedCopy> copies,
                         const std::function<void()>& checksums_queued) {
  if (ranges.empty()) return;
  const shim::cu::DevicePtr on_gpu =
      queue_on_device(ordinal, ranges, stream, scratch, expected, copies, checksums_queued);
  FERRY_CU(cuMemcpyDtoHAsync, digests, on_gpu, ranges.size() * sizeof(std::uint64_t), stream);
}

}  // namespace ferry::detail
