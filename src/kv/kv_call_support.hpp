// What KVStore's calls share (kv_store.cpp, kv_put.cpp, kv_reader.cpp): results in words, a
// block's size and the checks of its pieces, and the time a step took.
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <string>

#include "ferry/device.hpp"
#include "ferry/kv_store.hpp"
#include "kv/block_io.hpp"

namespace ferry::detail::kv {

inline KVResult result(KVStatus status, std::string message = {}) {
  return {status, std::move(message), KVRoute::none, {}};
}

using Clock = std::chrono::steady_clock;
inline double seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// UINT64_MAX where the pieces add up past it: lengths that wrap around 2^64 to a valid size (a
// host's arithmetic slip) are refused as a bad size.
inline std::uint64_t total_size(KVBlock block) {
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t sum = 0;
  for (const KVPiece& p : block) sum = p.size > kMax - sum ? kMax : sum + p.size;
  return sum;
}

// Why a block's pieces cannot be used, or an empty string.
inline std::string check_pieces(KVBlock block) {
  for (const KVPiece& p : block) {
    if (p.data == nullptr && p.size != 0) return "a piece of " + std::to_string(p.size) +
                                                 " bytes has no memory (null pointer)";
    if (p.device.is_cuda() && !cuda_available())
      return "a piece is on " + p.device.to_string() + ", but no GPU is usable here";
  }
  return {};
}

inline KVStatus status_of(BlockOutcome outcome) {
  switch (outcome) {
    case BlockOutcome::ok:
      return KVStatus::ok;
    case BlockOutcome::checksum_mismatch:
      return KVStatus::missing;
    case BlockOutcome::unsupported:
      return KVStatus::unsupported;
    case BlockOutcome::io_error:
      break;
  }
  return KVStatus::io_error;
}

}  // namespace ferry::detail::kv
