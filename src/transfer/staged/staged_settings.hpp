// The staged path's settings: what the options ask for, fitted into the staging bound and
// shrunk to the work; the chunk that spreads a small submission over every worker.
#pragma once

#include <cstdint>

#include "ferry/transfer.hpp"
#include "transfer/staged/staged_plan.hpp"

namespace ferry::detail {

struct TicketState;

inline constexpr std::uint64_t kDefaultChunk = 4ull << 20;
inline constexpr unsigned kMaxSlots = 64;  // slots per worker
// Edge pieces (staged_plan.hpp) no smaller than this: below it copies and reads cost per call.
inline constexpr std::uint64_t kMinEdgeChunk = 256ull << 10;

struct StagedSettings {
  unsigned threads = 1;
  unsigned slots = 2;
  std::uint64_t chunk = kDefaultChunk;
};

// A slot holds a chunk and room for an unaligned head (the data sits at the file offset's
// distance from the page below it) and, for reads, the tail an O_DIRECT read rounds up.
std::uint64_t slot_bytes(std::uint64_t chunk, Direction direction);

StagedSettings wanted_settings(const TransferOptions& o);

// Fits the wanted settings into the submission's staging: fewer threads first, then fewer slots.
StagedSettings fit_staging(const TransferOptions& o, Direction direction, StagedSettings s);

// fit_staging, then shrinks them to the work: no thread or slot without a group to move, no slot
// larger than the largest group.
StagedSettings configure(const TransferOptions& o, Direction direction, StagedSettings s,
                         const StagedPlan& plan);

// For a submission of fewer than a few chunks per wanted worker: the chunk that gives each worker
// several pieces, so its first copies start after a fraction of its share and its reads overlap
// them; never below smallest_spread_piece (kMinEdgeChunk for page-cache reads, 1 MiB for the
// device: a disk wants larger requests).
std::uint64_t smallest_spread_piece(const TicketState& t);
std::uint64_t spread_chunk(const TicketState& t, const StagedSettings& wanted);

}  // namespace ferry::detail
