// One process-wide staging buffer kept between loads: pinning host memory costs about as much
// time per byte as moving a small checkpoint, so a second load reuses the first one's staging.
// Loads running at the same time each get their own buffer; only one is kept.
#pragma once

#include <cstddef>

#include "cuda/cuda_resources.hpp"

namespace ferry::detail {

// A buffer of at least `bytes`, pinned when `pin_in` is given: the kept one if it fits, else new.
HostBuffer take_staging(std::size_t bytes, const PrimaryContext* pin_in);

// Keeps `buffer` for the next load (the larger of it and the one already kept).
void keep_staging(HostBuffer buffer);

// Frees the kept buffer.
void release_staging();

}  // namespace ferry::detail
