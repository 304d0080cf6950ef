#include "transfer/staged/staged_settings.hpp"

#include <algorithm>
#include <thread>

#include "ferry/error.hpp"
#include "platform/file.hpp"
#include "transfer/ticket_state.hpp"
#include "services/worker_pool.hpp"

namespace ferry::detail {
namespace {

constexpr unsigned kDefaultThreads = 16;
constexpr std::uint64_t kSpreadPieces = 4;  // pieces per worker spread_chunk aims at

}  // namespace

std::uint64_t slot_bytes(std::uint64_t chunk, Direction direction) {
  const std::uint64_t slack = (direction == Direction::FileToMemory ? 2 : 1) * kDirectAlignment;
  return (chunk + slack + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
}

StagedSettings wanted_settings(const TransferOptions& o) {
  StagedSettings s;
  // hardware_concurrency() reads /sys on each call: once per process is enough.
  static const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  s.threads = std::min(o.threads ? o.threads : std::min(cores, kDefaultThreads), kMaxWorkerThreads);
  s.slots = o.slots_per_thread ? std::min(o.slots_per_thread, kMaxSlots) : 2;
  s.chunk = o.chunk_bytes
                ? (o.chunk_bytes + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment
                : kDefaultChunk;
  return s;
}

StagedSettings fit_staging(const TransferOptions& o, Direction direction, StagedSettings s) {
  const auto fits = [&] {
    return std::uint64_t{s.slots} * s.threads * slot_bytes(s.chunk, direction) <= o.staging_bytes;
  };
  while (s.threads > 1 && !fits()) --s.threads;
  while (s.slots > 1 && !fits()) --s.slots;
  FERRY_EXPECT(fits(), std::invalid_argument, "staging of ", o.staging_bytes,
               " bytes cannot hold one slot of ", s.chunk, "-byte ",
               direction == Direction::FileToMemory ? "reads" : "writes");
  return s;
}

StagedSettings configure(const TransferOptions& o, Direction direction, StagedSettings s,
                         const StagedPlan& plan) {
  s = fit_staging(o, direction, s);
  const std::uint64_t groups = plan.groups.size();
  if (groups == 0) return s;
  s.threads = static_cast<unsigned>(std::clamp<std::uint64_t>(groups, 1, s.threads));
  const std::uint64_t per_thread = (groups + s.threads - 1) / s.threads;
  s.slots = static_cast<unsigned>(std::clamp<std::uint64_t>(per_thread, 1, s.slots));
  s.chunk = std::min(s.chunk, std::max<std::uint64_t>(plan.largest_group, 1));
  return s;
}

std::uint64_t smallest_spread_piece(const TicketState& t) {
  const bool cached = t.direction == Direction::FileToMemory && t.options.io == IoMode::Buffered;
  return cached ? kMinEdgeChunk : 1ull << 20;
}
std::uint64_t spread_chunk(const TicketState& t, const StagedSettings& wanted) {
  std::uint64_t total = 0;
  for (const Extent& x : t.extents)
    for (const MemorySpan& s : x.spans) total += s.size;
  const std::uint64_t share = total / (std::uint64_t{wanted.threads} * kSpreadPieces);
  const std::uint64_t aligned =
      (share + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
  return std::clamp(aligned, std::min(smallest_spread_piece(t), wanted.chunk), wanted.chunk);
}

}  // namespace ferry::detail
