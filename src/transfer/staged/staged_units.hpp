// An observed read's units of work (TransferOptions::observer, file -> memory, interleave): runs
// of consecutive groups of a plan cut extent by extent, no extent crossing two units. A worker
// takes a unit and moves its groups in order, so it observes (say, checksums) each extent's bytes
// in order itself, never waiting for the bytes of another worker, and different extents are
// observed on different workers at once.
#pragma once

#include <cstddef>
#include <vector>

#include "transfer/staged/staged_plan.hpp"

namespace ferry::detail {

// The units' first groups and then the end (plan.groups.size()); empty where units would leave
// workers idle: where `workers` workers, each taking the next unit when free, would take more
// than 5/4 of an even share of the bytes (a few large extents: then rounds across the extents,
// observed in order across workers, spread them better).
std::vector<std::size_t> observed_units(const StagedPlan& plan, unsigned workers);

}  // namespace ferry::detail
