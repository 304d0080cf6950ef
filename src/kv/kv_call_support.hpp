// What KVStore's calls share (kv_store.cpp, kv_put.cpp, kv_reader.cpp): results in words, a
// block's size and the checks of its pieces, and the time a step took.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

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
  int gpu = -1;
  bool gpu_checked = false;  // whether a GPU is usable: asked once a block, not once a piece
  for (const KVPiece& p : block) {
    if (p.data == nullptr && p.size != 0) return "a piece of " + std::to_string(p.size) +
                                                 " bytes has no memory (null pointer)";
    if (p.device.is_cuda() && !gpu_checked) {
      if (!cuda_available())
        return "a piece is on " + p.device.to_string() + ", but no GPU is usable here";
      gpu_checked = true;
    }
    if (p.size == 0 || !p.device.is_cuda()) continue;
    if (gpu >= 0 && p.device.index != gpu)
      return "its pieces lie on cuda:" + std::to_string(gpu) + " and " + p.device.to_string() +
             " (a block's GPU pieces must all be on one GPU)";
    gpu = p.device.index;
  }
  // No two pieces may share a byte (a get would write it twice, in no defined order): checked
  // between neighbours in (host first, then GPU; address) order. The engines' pages come in
  // address order already (a layer's K page, its V page, the next layer's): one pass checks each
  // against the last of its memory, and only pieces out of order are sorted (a sort per block
  // was 2 ms of a 1,024-block call of 64 pieces each).
  const auto address = [&](std::size_t i) {
    return reinterpret_cast<std::uintptr_t>(block[i].data);
  };
  const auto overlap = [&](std::size_t a, std::size_t b) {
    const KVPiece &x = block[a], &y = block[b];
    return "pieces " + std::to_string(std::min(a, b)) + " and " + std::to_string(std::max(a, b)) +
           " overlap (" + std::to_string(x.size) + " bytes at " + std::to_string(address(a)) +
           " and " + std::to_string(y.size) + " bytes at " + std::to_string(address(b)) + " on " +
           x.device.to_string() + ")";
  };
  constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();
  std::size_t last[2] = {kNone, kNone};  // per memory (host, GPU): the last piece seen
  bool sorted = true;
  for (std::size_t i = 0; i < block.size() && sorted; ++i) {
    if (!block[i].size) continue;
    std::size_t& previous = last[block[i].device.is_cuda()];
    if (previous != kNone) {
      if (address(previous) >= address(i))
        sorted = false;
      else if (address(previous) + block[previous].size > address(i))
        return overlap(previous, i);
    }
    previous = i;
  }
  if (sorted) return {};
  const auto before = [&](std::size_t a, std::size_t b) {
    const bool ga = block[a].device.is_cuda(), gb = block[b].device.is_cuda();
    return ga != gb ? gb : address(a) < address(b);
  };
  std::vector<std::size_t> order;
  order.reserve(block.size());
  for (std::size_t i = 0; i < block.size(); ++i)
    if (block[i].size) order.push_back(i);
  std::sort(order.begin(), order.end(), before);
  for (std::size_t k = 1; k < order.size(); ++k) {
    const KVPiece& a = block[order[k - 1]];
    if (a.device.is_cuda() == block[order[k]].device.is_cuda() &&
        address(order[k - 1]) + a.size > address(order[k]))
      return overlap(order[k - 1], order[k]);
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
