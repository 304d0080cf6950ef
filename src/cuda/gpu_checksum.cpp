#include "cuda/gpu_checksum.hpp"

#include <map>
#include <memory>
#include <mutex>

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

#include "cuda/cuda_resources.hpp"
#include "cuda/xxh3_lanes.hpp"
#include "ferry/error.hpp"

namespace ferry::detail {

#ifdef FERRY_GPU_CHECKSUM_PTX
extern const char kXxh3BlocksPtx[];  // xxh3_blocks.cu built by nvcc (the generated file)
#endif

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

struct Loaded {
  shim::cu::Function gains = nullptr, finish = nullptr;
  std::string why_not;  // set where the kernel cannot run
};

std::string why_no_kernel() {
#ifdef FERRY_GPU_CHECKSUM_PTX
  const auto& d = shim::CudaDriver::get();
  if (!d.usable) return d.why_unusable;
  if (!d.cuModuleLoadData || !d.cuModuleGetFunction || !d.cuLaunchKernel)
    return "the CUDA driver lacks cuModuleLoadData, cuModuleGetFunction or cuLaunchKernel";
  return "";
#else
  return "this build of ferry has no GPU checksum kernel (nvcc was not found when it was built)";
#endif
}

// The kernel, loaded once per device into its primary context (never unloaded: the module lives
// as long as the process, like the driver).
const Loaded& kernel(int ordinal) {
  static std::mutex mutex;
  static auto* loaded = new std::map<int, Loaded>;
  std::lock_guard lock(mutex);
  if (auto it = loaded->find(ordinal); it != loaded->end()) return it->second;
  Loaded& l = (*loaded)[ordinal];
  l.why_not = why_no_kernel();
#ifdef FERRY_GPU_CHECKSUM_PTX
  if (l.why_not.empty()) {
    try {
      device_context(ordinal).make_current();
      shim::cu::Module module = nullptr;
      FERRY_CU(cuModuleLoadData, &module, kXxh3BlocksPtx);
      FERRY_CU(cuModuleGetFunction, &l.gains, module, "ferry_xxh3_gains");
      FERRY_CU(cuModuleGetFunction, &l.finish, module, "ferry_xxh3_finish");
    } catch (const std::exception& e) {
      l.gains = l.finish = nullptr;
      l.why_not = std::string("loading the GPU checksum kernel: ") + e.what();
    }
  }
#endif
  return l;
}

const xxh3::Keys& default_keys() {
  static const xxh3::Keys keys = xxh3::make_keys(XXH3_kSecret);
  return keys;
}

}  // namespace

std::string gpu_checksum_unavailable(int ordinal) { return kernel(ordinal).why_not; }

std::vector<std::uint64_t> gpu_checksums(int ordinal, std::span<const DeviceBytes> ranges,
                                         shim::cu::Stream stream) {
  GpuChecksumScratch scratch;
  return gpu_checksums(ordinal, ranges, stream, scratch);
}

std::vector<std::uint64_t> gpu_checksums(int ordinal, std::span<const DeviceBytes> ranges,
                                         shim::cu::Stream stream, GpuChecksumScratch& scratch) {
  const Loaded& k = kernel(ordinal);
  FERRY_EXPECT(k.why_not.empty(), CudaError, "the GPU checksum cannot run on cuda:", ordinal, ": ",
               k.why_not);
  FERRY_EXPECT(ranges.size() < (1ull << 32), std::invalid_argument, ranges.size(),
               " ranges in one GPU checksum call; at most 2^32 - 1");
  std::vector<std::uint64_t> digests(ranges.size());
  if (ranges.empty()) return digests;
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
  const std::uint64_t gain_bytes = gain_rows * xxh3::kLanes * sizeof(std::uint64_t);
  const std::uint64_t job_bytes = jobs.size() * sizeof(Job);
  device_context(ordinal).make_current();
  const std::uint64_t need = gain_bytes + job_bytes + digests.size() * sizeof(std::uint64_t);
  if (scratch.bytes < need) {
    scratch.memory.reset();
    scratch.memory = allocate_device_memory(std::make_shared<PrimaryContext>(ordinal), need);
    scratch.bytes = need;
  }
  // Gains first: 16-byte stores need 16-byte alignment, and the allocation's start has it.
  auto gains_on_gpu = reinterpret_cast<shim::cu::DevicePtr>(scratch.memory.get());
  shim::cu::DevicePtr jobs_on_gpu = gains_on_gpu + gain_bytes;
  shim::cu::DevicePtr digests_on_gpu = jobs_on_gpu + job_bytes;
  FERRY_CU(cuMemcpyHtoDAsync, jobs_on_gpu, jobs.data(), job_bytes, stream);
  auto count = static_cast<unsigned>(jobs.size());
  xxh3::Keys keys = default_keys();
  if (segments > 0) {
    const std::uint64_t ctas = (segments * 32 + kGainThreads - 1) / kGainThreads;
    FERRY_EXPECT(ctas < (1ull << 31), std::invalid_argument, gain_rows,
                 " KiB in one GPU checksum call; at most 2^37 KiB");
    void* params[] = {&jobs_on_gpu, &count, &segments, &keys, &gains_on_gpu};
    FERRY_CU(cuLaunchKernel, k.gains, static_cast<unsigned>(ctas), 1, 1, kGainThreads, 1, 1, 0,
             stream, params, nullptr);
  }
  void* params[] = {&jobs_on_gpu, &count, &keys, &gains_on_gpu, &digests_on_gpu};
  const unsigned ctas = (count + kGroupsPerCta - 1) / kGroupsPerCta;
  FERRY_CU(cuLaunchKernel, k.finish, ctas, 1, 1, kFinishThreads, 1, 1, 0, stream, params,
           nullptr);
  FERRY_CU(cuMemcpyDtoHAsync, digests.data(), digests_on_gpu,
           digests.size() * sizeof(std::uint64_t), stream);
  FERRY_CU(cuStreamSynchronize, stream);
  return digests;
}

}  // namespace ferry::detail
