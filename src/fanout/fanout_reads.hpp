// What both kinds of group load (one process for every device, fanout_load.cpp; one process per
// rank, rank_rounds.cpp) hand the transfer core: a plan's reads as extents into the ranks'
// memory, and the staged path's options from the engine's settings.
#pragma once

#include <cstdint>
#include <vector>

#include "ferry/device.hpp"
#include "ferry/load_options.hpp"
#include "ferry/shard_plan.hpp"
#include "ferry/transfer.hpp"
#include "load/settings.hpp"

namespace ferry::detail {

// One read becomes one extent: its copies are back to back in the chunk; neighbours that are
// contiguous on the same rank become one span. `bases` and `scratch`: per rank, its memory and
// its scratch banks (0 where a rank is not read here).
std::vector<Extent> resolve(const std::vector<FanoutRead>& reads,
                            const std::vector<std::uintptr_t>& bases,
                            const std::vector<std::uintptr_t>& scratch,
                            const std::vector<Device>& devices);

// The staged path (never cuFile: a group load's reads scatter into several ranks), stopping at
// the first error.
TransferOptions transfer_options(const LoadOptions& load, const EngineSettings& settings);

}  // namespace ferry::detail
