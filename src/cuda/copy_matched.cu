// Device-to-device copies from a table, one launch for all of them: made only where a block's
// GPU checksum matched what it should be (the scatter of per-layer pieces out of a bounce buffer
// once their block is known good, queued after the checksum on the same stream with no round trip
// through the host, gpu_checksum.cpp), or, with no digests given, all of them (the gather of a
// put's pieces into contiguous runs and the scatter of a get's verified runs, device_copies.cpp).
// A CTA per slice of at most kSliceBytes, so a few large pieces spread as many small ones do.

namespace {

struct MatchedCopy {  // gpu_checksum.cpp's, byte for byte
  const unsigned char* from;
  unsigned char* to;
  unsigned long long size;
  unsigned long long block;        // the digest that must match
  unsigned long long first_slice;  // its first slice among all the call's
};

constexpr unsigned long long kSliceBytes = 64 * 1024;  // gpu_checksum.cpp's

}  // namespace

extern "C" __global__ void ferry_copy_matched(const MatchedCopy* copies, unsigned count,
                                              const unsigned long long* digests,
                                              const unsigned long long* expected) {
  const unsigned long long slice = blockIdx.x;
  unsigned lo = 0, hi = count - 1;  // the last copy whose first slice is at or before this one
  while (lo < hi) {
    const unsigned mid = lo + (hi - lo + 1) / 2;
    if (copies[mid].first_slice <= slice) lo = mid; else hi = mid - 1;
  }
  const MatchedCopy c = copies[lo];
  if (digests && digests[c.block] != expected[c.block]) return;
  const unsigned long long begin = (slice - c.first_slice) * kSliceBytes;
  const unsigned long long end = begin + kSliceBytes < c.size ? begin + kSliceBytes : c.size;
  const auto aligned = [](const void* p) { return reinterpret_cast<unsigned long long>(p) % 16 == 0; };
  if (aligned(c.from) && aligned(c.to) && begin % 16 == 0 && end % 16 == 0) {
    const auto* from = reinterpret_cast<const uint4*>(c.from + begin);
    auto* to = reinterpret_cast<uint4*>(c.to + begin);
    const unsigned words = static_cast<unsigned>((end - begin) / 16);
    for (unsigned i = threadIdx.x; i < words; i += blockDim.x) to[i] = __ldg(from + i);
  } else {
    for (unsigned long long i = begin + threadIdx.x; i < end; i += blockDim.x) c.to[i] = c.from[i];
  }
}
