// The kernels behind gpu_checksum.cpp: XXH3-64 of many blocks in device memory (xxh3_lanes.hpp),
// in two steps so that a few large blocks spread over the whole GPU as well as many small ones:
// ferry_xxh3_gains sums the gains of every full 1 KiB block of every input (a warp per segment of
// kBlocksPerSegment of them), ferry_xxh3_finish runs each input's scrambles in order from those
// gains, adds its tail and merges (8 threads per input, one per accumulator). Built to PTX by
// nvcc and embedded; the driver compiles it for the GPU it runs on.
#include "cuda/xxh3_lanes.hpp"

namespace {

using namespace ferry::xxh3;

struct Job {  // gpu_checksum.cpp's, byte for byte
  const unsigned char* data;
  unsigned long long size;
  unsigned long long first_gain;     // where its blocks' gains start in `gains` (in blocks)
  unsigned long long first_segment;  // its first segment among all the call's
};

constexpr unsigned kBlocksPerSegment = 8;  // gpu_checksum.cpp's
constexpr unsigned kWarp = 32;

// The first word of lanes (2 * pair, 2 * pair + 1) of the stripe at byte `at`.
struct Words {
  std::uint64_t even, odd;
};
__device__ __forceinline__ Words words16(const unsigned char* in, std::uint64_t at) {
  const ulonglong2 w = __ldg(reinterpret_cast<const ulonglong2*>(in + at));
  return {w.x, w.y};
}
__device__ __forceinline__ Words words8(const unsigned char* in, std::uint64_t at) {
  const auto* w = reinterpret_cast<const unsigned long long*>(in + at);
  return {__ldg(w), __ldg(w + 1)};
}
__device__ __forceinline__ Words words1(const unsigned char* in, std::uint64_t at) {
  return {load64(in + at), load64(in + at + 8)};
}

// One warp's segment: thread t takes lanes 2 * (t % 4) and 2 * (t % 4) + 1 of stripes t / 4 and
// t / 4 + 8 of each block (so a warp reads 512 contiguous bytes at a time), then the 8 threads of
// a lane pair add up their sums.
template <class Load>
__device__ __forceinline__ void segment_gains(const unsigned char* in, std::uint64_t first,
                                              unsigned count, const std::uint64_t* key,
                                              ulonglong2* out, Load load) {
  const unsigned t = threadIdx.x % kWarp;
  const unsigned pair = t % 4;
  const unsigned row = t / 4;
  std::uint64_t even[kBlocksPerSegment], odd[kBlocksPerSegment];
#pragma unroll
  for (unsigned b = 0; b < kBlocksPerSegment; ++b) {
    even[b] = odd[b] = 0;
    if (b >= count) continue;
#pragma unroll
    for (unsigned half = 0; half < 2; ++half) {
      const unsigned s = row + 8 * half;
      const Words w = load(in, (first + b) * kBlockBytes + s * kStripeBytes + 16 * pair);
      even[b] += stripe_gain(w.even, w.odd, key[s + 2 * pair]);
      odd[b] += stripe_gain(w.odd, w.even, key[s + 2 * pair + 1]);
    }
  }
#pragma unroll
  for (unsigned b = 0; b < kBlocksPerSegment; ++b) {
#pragma unroll
    for (unsigned mask = 4; mask < kWarp; mask <<= 1) {
      even[b] += __shfl_xor_sync(0xFFFFFFFFu, even[b], mask);
      odd[b] += __shfl_xor_sync(0xFFFFFFFFu, odd[b], mask);
    }
    if (row == 0 && b < count) out[b * 4 + pair] = make_ulonglong2(even[b], odd[b]);
  }
}

}  // namespace

extern "C" __global__ void ferry_xxh3_gains(const Job* jobs, unsigned count,
                                            unsigned long long segments, Keys keys,
                                            ulonglong2* gains) {
  __shared__ std::uint64_t key[24];
  if (threadIdx.x < 24) key[threadIdx.x] = keys.stripe[threadIdx.x];
  __syncthreads();
  const unsigned long long warp = (blockIdx.x * 1ull * blockDim.x + threadIdx.x) / kWarp;
  if (warp >= segments) return;  // whole warps leave together
  unsigned lo = 0, hi = count - 1;  // the last job whose first segment is at or before this one
  while (lo < hi) {
    const unsigned mid = lo + (hi - lo + 1) / 2;
    if (jobs[mid].first_segment <= warp) lo = mid; else hi = mid - 1;
  }
  const Job job = jobs[lo];
  const std::uint64_t first = (warp - job.first_segment) * kBlocksPerSegment;
  const std::uint64_t left = scrambled_blocks(job.size) - first;
  const unsigned n = left < kBlocksPerSegment ? static_cast<unsigned>(left) : kBlocksPerSegment;
  ulonglong2* out = gains + (job.first_gain + first) * 4;
  const auto address = reinterpret_cast<std::uintptr_t>(job.data);
  if (address % 16 == 0) segment_gains(job.data, first, n, key, out, words16);
  else if (address % 8 == 0) segment_gains(job.data, first, n, key, out, words8);
  else segment_gains(job.data, first, n, key, out, words1);
}

extern "C" __global__ void ferry_xxh3_finish(const Job* jobs, unsigned count, Keys keys,
                                             const unsigned long long* gains,
                                             unsigned long long* digests) {
  constexpr unsigned kGroupsPerCta = 32;  // blockDim.x == kLanes * kGroupsPerCta
  __shared__ std::uint64_t accs[kGroupsPerCta][kLanes];
  const unsigned group = threadIdx.x / kLanes;
  const unsigned lane = threadIdx.x % kLanes;
  const unsigned j = blockIdx.x * kGroupsPerCta + group;
  if (j >= count) return;  // a whole group of 8 leaves together
  const unsigned char* in = jobs[j].data;
  const std::uint64_t len = jobs[j].size;
  if (len <= kMidSizeMax) {
    if (lane == 0) digests[j] = hash_short(in, len, keys);
    return;
  }
  const unsigned long long* mine = gains + jobs[j].first_gain * kLanes + lane;
  const auto gain = [mine](std::uint64_t b) { return __ldg(mine + b * kLanes); };
  std::uint64_t acc;
  if (reinterpret_cast<std::uintptr_t>(in) % 8 == 0) {
    const auto* words = reinterpret_cast<const std::uint64_t*>(in);
    acc = lane_from_gains(in, len, lane, keys, gain,
                          [words](std::uint64_t at) { return __ldg(words + at / 8); });
  } else {
    acc = lane_from_gains(in, len, lane, keys, gain,
                          [in](std::uint64_t at) { return load64(in + at); });
  }
  accs[group][lane] = acc;
  const unsigned mask = 0xFFu << (threadIdx.x % 32 / kLanes * kLanes);
  __syncwarp(mask);
  if (lane == 0) digests[j] = merge(accs[group], len, keys);
}
