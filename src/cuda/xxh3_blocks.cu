// The kernel behind gpu_checksum.cpp: XXH3-64 of many blocks in device memory, 8 threads per
// block (one per accumulator, xxh3_lanes.hpp). Built to PTX by nvcc and embedded; the driver
// compiles it for the GPU it runs on.
#include "cuda/xxh3_lanes.hpp"

namespace {

struct Job {
  const unsigned char* data;
  unsigned long long size;
};

}  // namespace

extern "C" __global__ void ferry_xxh3_blocks(const Job* jobs, unsigned count,
                                             ferry::xxh3::Keys keys, unsigned long long* digests) {
  using namespace ferry::xxh3;
  constexpr unsigned kGroupsPerCta = 32;  // blockDim.x == kLanes * kGroupsPerCta
  __shared__ std::uint64_t accs[kGroupsPerCta][kLanes];
  const unsigned group = threadIdx.x / kLanes;
  const unsigned lane = threadIdx.x % kLanes;
  const unsigned job = blockIdx.x * kGroupsPerCta + group;
  if (job >= count) return;  // a whole group of 8 leaves together
  const unsigned char* in = jobs[job].data;
  const std::uint64_t len = jobs[job].size;
  if (len <= kMidSizeMax) {
    if (lane == 0) digests[job] = hash_short(in, len, keys);
    return;
  }
  std::uint64_t acc;
  if (reinterpret_cast<std::uintptr_t>(in) % 8 == 0) {
    const auto* words = reinterpret_cast<const std::uint64_t*>(in);
    acc = lane_accumulator(in, len, lane, keys,
                           [words](std::uint64_t at) { return __ldg(words + at / 8); });
  } else {
    acc = lane_accumulator(in, len, lane, keys, [in](std::uint64_t at) { return load64(in + at); });
  }
  accs[group][lane] = acc;
  const unsigned mask = 0xFFu << (threadIdx.x % 32 / kLanes * kLanes);
  __syncwarp(mask);
  if (lane == 0) digests[job] = merge(accs[group], len, keys);
}
