// XXH3-64 (seed 0) split across the 8 accumulators of its long-input loop and its 1 KiB blocks, so
// that GPU threads hash one input together: the KV store's block checksum computed where the
// block landed. Written
// from the XXH3 specification; compiled by nvcc for the kernel (xxh3_blocks.cu) and by the host
// compiler for the test that holds it equal to libxxhash for every length class.
//
// Why lanes work: in XXH3's long loop accumulator i takes input word i^1 and the product of the
// halves of (word i ^ key i); the scramble every 1 KiB acts on each accumulator alone. So each
// accumulator evolves on its own given the bytes, and only the final merge needs all 8. Within a
// 1 KiB block the stripes' gains are only added, so the blocks' gains can be summed in parallel
// and only the scrambles need to run in order (lane_from_gains).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define FERRY_HD __host__ __device__ __forceinline__
#else
#define FERRY_HD inline
#endif
#ifdef __CUDA_ARCH__
#define FERRY_UNROLL _Pragma("unroll")
#else
#define FERRY_UNROLL
#endif

namespace ferry::xxh3 {

inline constexpr unsigned kLanes = 8;
inline constexpr std::uint64_t kSecretBytes = 192;  // XXH3's default secret
inline constexpr std::uint64_t kStripeBytes = 64;
inline constexpr std::uint64_t kStripesPerBlock = (kSecretBytes - kStripeBytes) / 8;  // 16
inline constexpr std::uint64_t kBlockBytes = kStripeBytes * kStripesPerBlock;         // 1 KiB
inline constexpr std::uint64_t kMidSizeMax = 240;  // longer inputs take the lane loop

inline constexpr std::uint64_t kPrime32_1 = 0x9E3779B1u;
inline constexpr std::uint64_t kPrime32_2 = 0x85EBCA77u;
inline constexpr std::uint64_t kPrime32_3 = 0xC2B2AE3Du;
inline constexpr std::uint64_t kPrime64_1 = 0x9E3779B185EBCA87ull;
inline constexpr std::uint64_t kPrime64_2 = 0xC2B2AE3D27D4EB4Full;
inline constexpr std::uint64_t kPrime64_3 = 0x165667B19E3779F9ull;
inline constexpr std::uint64_t kPrime64_4 = 0x85EBCA77C2B2AE63ull;
inline constexpr std::uint64_t kPrime64_5 = 0x27D4EB2F165667C5ull;
inline constexpr std::uint64_t kPrimeMx1 = 0x165667919E3779F9ull;
inline constexpr std::uint64_t kPrimeMx2 = 0x9FB21C651E98DF25ull;

// The secret's words as the loops read them, taken once on the host (several sit at offsets
// that are not multiples of 8), and the raw bytes for the short-input paths.
struct Keys {
  std::uint64_t stripe[24];   // word j at byte 8j: stripe s of a block, lane i reads s + i
  std::uint64_t last[kLanes];  // at byte 121 + 8i: the input's last stripe
  std::uint64_t merge[kLanes]; // at byte 11 + 8i: the final merge
  unsigned char raw[kSecretBytes];
};

FERRY_HD std::uint64_t load64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int b = 7; b >= 0; --b) v = (v << 8) | p[b];
  return v;
}
FERRY_HD std::uint32_t load32(const unsigned char* p) {
  return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
         static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}

// Fills Keys from the 192 secret bytes.
inline Keys make_keys(const unsigned char* secret) {
  Keys k{};
  for (unsigned j = 0; j < 24; ++j) k.stripe[j] = load64(secret + 8 * j);
  for (unsigned i = 0; i < kLanes; ++i) {
    k.last[i] = load64(secret + kSecretBytes - kStripeBytes - 7 + 8 * i);
    k.merge[i] = load64(secret + 11 + 8 * i);
  }
  for (unsigned b = 0; b < kSecretBytes; ++b) k.raw[b] = secret[b];
  return k;
}

FERRY_HD std::uint64_t mul128_fold64(std::uint64_t a, std::uint64_t b) {
#ifdef __CUDA_ARCH__
  return (a * b) ^ __umul64hi(a, b);
#else
  const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  return static_cast<std::uint64_t>(p) ^ static_cast<std::uint64_t>(p >> 64);
#endif
}
FERRY_HD std::uint64_t rotl64(std::uint64_t x, unsigned r) { return (x << r) | (x >> (64 - r)); }
FERRY_HD std::uint64_t swap64(std::uint64_t x) {
  std::uint64_t r = 0;
  for (int b = 0; b < 8; ++b) r = (r << 8) | ((x >> (8 * b)) & 0xFF);
  return r;
}

FERRY_HD std::uint64_t avalanche(std::uint64_t h) {
  h ^= h >> 37;
  h *= kPrimeMx1;
  return h ^ (h >> 32);
}
FERRY_HD std::uint64_t xxh64_avalanche(std::uint64_t h) {
  h ^= h >> 33;
  h *= kPrime64_2;
  h ^= h >> 29;
  h *= kPrime64_3;
  return h ^ (h >> 32);
}
FERRY_HD std::uint64_t rrmxmx(std::uint64_t h, std::uint64_t len) {
  h ^= rotl64(h, 49) ^ rotl64(h, 24);
  h *= kPrimeMx2;
  h ^= (h >> 35) + len;
  h *= kPrimeMx2;
  return h ^ (h >> 28);
}
FERRY_HD std::uint64_t mix16(const unsigned char* in, const unsigned char* secret) {
  return mul128_fold64(load64(in) ^ load64(secret), load64(in + 8) ^ load64(secret + 8));
}

// XXH3-64 of inputs of at most 240 bytes (one thread).
FERRY_HD std::uint64_t hash_short(const unsigned char* in, std::uint64_t len, const Keys& k) {
  const unsigned char* s = k.raw;
  if (len == 0) return xxh64_avalanche(load64(s + 56) ^ load64(s + 64));
  if (len <= 3) {
    const std::uint32_t combined = static_cast<std::uint32_t>(in[0]) << 16 |
                                   static_cast<std::uint32_t>(in[len >> 1]) << 24 |
                                   static_cast<std::uint32_t>(in[len - 1]) |
                                   static_cast<std::uint32_t>(len) << 8;
    const std::uint64_t flip = load32(s) ^ load32(s + 4);
    return xxh64_avalanche(combined ^ flip);
  }
  if (len <= 8) {
    const std::uint64_t flip = load64(s + 8) ^ load64(s + 16);
    const std::uint64_t both = load32(in + len - 4) + (static_cast<std::uint64_t>(load32(in)) << 32);
    return rrmxmx(both ^ flip, len);
  }
  if (len <= 16) {
    const std::uint64_t lo = load64(in) ^ (load64(s + 24) ^ load64(s + 32));
    const std::uint64_t hi = load64(in + len - 8) ^ (load64(s + 40) ^ load64(s + 48));
    return avalanche(len + swap64(lo) + hi + mul128_fold64(lo, hi));
  }
  std::uint64_t acc = len * kPrime64_1;
  if (len <= 128) {
    if (len > 32) {
      if (len > 64) {
        if (len > 96) acc += mix16(in + 48, s + 96) + mix16(in + len - 64, s + 112);
        acc += mix16(in + 32, s + 64) + mix16(in + len - 48, s + 80);
      }
      acc += mix16(in + 16, s + 32) + mix16(in + len - 32, s + 48);
    }
    return avalanche(acc + mix16(in, s) + mix16(in + len - 16, s + 16));
  }
  for (unsigned i = 0; i < 8; ++i) acc += mix16(in + 16 * i, s + 16 * i);
  acc = avalanche(acc);
  const unsigned rounds = static_cast<unsigned>(len / 16);
  for (unsigned i = 8; i < rounds; ++i) acc += mix16(in + 16 * i, s + 16 * (i - 8) + 3);
  return avalanche(acc + mix16(in + len - 16, s + 136 - 17));
}

FERRY_HD std::uint64_t initial_acc(unsigned lane) {
  constexpr std::uint64_t init[kLanes] = {kPrime32_3, kPrime64_1, kPrime64_2, kPrime64_3,
                                          kPrime64_4, kPrime32_2, kPrime64_5, kPrime32_1};
  return init[lane];
}

// What one stripe adds to an accumulator: the pair's word, and the product of the halves of its
// own word with its key.
FERRY_HD std::uint64_t stripe_gain(std::uint64_t mine, std::uint64_t pair, std::uint64_t key) {
  const std::uint64_t keyed = mine ^ key;
  return pair + (keyed & 0xFFFFFFFFull) * (keyed >> 32);
}

// The scramble after each full 1 KiB block (the last block is never scrambled, even when full).
FERRY_HD std::uint64_t scramble(std::uint64_t acc, std::uint64_t key) {
  acc ^= acc >> 47;
  acc ^= key;
  return acc * kPrime32_1;
}
FERRY_HD std::uint64_t scrambled_blocks(std::uint64_t len) { return (len - 1) / kBlockBytes; }

// What the 1 KiB block at byte `at` adds to accumulator `lane` before its scramble. The gains of
// different blocks are independent of each other, so many threads can sum them at once; only
// the scrambles run in order.
template <class Word>
FERRY_HD std::uint64_t block_gain(std::uint64_t at, unsigned lane, const Keys& k, Word word) {
  std::uint64_t sum = 0;
  for (unsigned s = 0; s < kStripesPerBlock; ++s)
    sum += stripe_gain(word(at + s * kStripeBytes + 8 * lane),
                       word(at + s * kStripeBytes + 8 * (lane ^ 1u)), k.stripe[s + lane]);
  return sum;
}

// Accumulator `lane` of a long input's hash (len > 240), before the merge, given `gain(b)`, the
// gain of full block b: the scrambles in order, then the stripes after the last full block and
// the last stripe. `word(offset)` reads the 8 input bytes at a byte offset that is a multiple of
// 8; the last stripe, which ends at the input's end wherever that falls, is read bytewise.
template <class Gain, class Word>
FERRY_HD std::uint64_t lane_from_gains(const unsigned char* in, std::uint64_t len, unsigned lane,
                                       const Keys& k, Gain gain, Word word) {
  std::uint64_t acc = initial_acc(lane);
  const std::uint64_t scramble_key = k.stripe[16 + lane];
  const std::uint64_t blocks = scrambled_blocks(len);
  // The gains are read 16 blocks ahead of their scrambles, so a GPU thread's loads are in flight
  // while it runs the 16 scrambles before them (the chain of scrambles is the critical path).
  constexpr unsigned kAhead = 16;
  std::uint64_t b = 0;
  if (blocks >= kAhead) {
    std::uint64_t ahead[kAhead];
    FERRY_UNROLL for (unsigned i = 0; i < kAhead; ++i) ahead[i] = gain(i);
    for (b = kAhead; b + kAhead <= blocks; b += kAhead) {
      std::uint64_t next[kAhead];
      FERRY_UNROLL for (unsigned i = 0; i < kAhead; ++i) next[i] = gain(b + i);
      FERRY_UNROLL for (unsigned i = 0; i < kAhead; ++i) acc = scramble(acc + ahead[i], scramble_key);
      FERRY_UNROLL for (unsigned i = 0; i < kAhead; ++i) ahead[i] = next[i];
    }
    FERRY_UNROLL for (unsigned i = 0; i < kAhead; ++i) acc = scramble(acc + ahead[i], scramble_key);
  }
  for (; b < blocks; ++b) acc = scramble(acc + gain(b), scramble_key);
  const std::uint64_t at = blocks * kBlockBytes;
  const unsigned stripes = static_cast<unsigned>(((len - 1) - at) / kStripeBytes);
  const unsigned pair = lane ^ 1u;
  for (unsigned s = 0; s < stripes; ++s)
    acc += stripe_gain(word(at + s * kStripeBytes + 8 * lane),
                       word(at + s * kStripeBytes + 8 * pair), k.stripe[s + lane]);
  const unsigned char* last = in + len - kStripeBytes;
  return acc + stripe_gain(load64(last + 8 * lane), load64(last + 8 * pair), k.last[lane]);
}

// Accumulator `lane`, one thread summing every block's gain itself.
template <class Word>
FERRY_HD std::uint64_t lane_accumulator(const unsigned char* in, std::uint64_t len, unsigned lane,
                                        const Keys& k, Word word) {
  const auto gain = [&](std::uint64_t b) { return block_gain(b * kBlockBytes, lane, k, word); };
  return lane_from_gains(in, len, lane, k, gain, word);
}

FERRY_HD std::uint64_t merge(const std::uint64_t* acc, std::uint64_t len, const Keys& k) {
  std::uint64_t result = len * kPrime64_1;
  for (unsigned i = 0; i < 4; ++i)
    result += mul128_fold64(acc[2 * i] ^ k.merge[2 * i], acc[2 * i + 1] ^ k.merge[2 * i + 1]);
  return avalanche(result);
}

}  // namespace ferry::xxh3
