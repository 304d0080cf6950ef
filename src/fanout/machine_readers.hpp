// How many reader threads a group load runs where the engine chooses them. A machine's storage
// and cores serve every rank it holds, whether one process reads for all its devices or one
// process per rank reads its own share: the machine's readers are counted together, then split
// between the processes and the rounds each has reading at once.
#pragma once

#include <cstdint>
#include <span>

#include "ferry/file_set.hpp"

namespace ferry::detail {

// Whether the reads of `files` (indices into `set`) come mostly from the page cache (at least
// half their bytes resident, as a load chooses buffered reads over O_DIRECT per file):
// memory copies on the reading cores. Otherwise they come from the one storage device.
bool reads_from_page_cache(const FileSet& set, std::span<const std::uint32_t> files);

// The readers the whole machine runs for `ranks` devices. From storage: what one load reads
// with (`one_load`, the engine's choice for a single device), since the device is one; 4 ranks
// x 16 O_DIRECT readers fell to 0.8 x of 4 x 4 on a virtio disk. From the page cache: one load's
// per device, at most the machine's cores (waiting copies spin; page-cache copies compete for
// the cores and memory).
unsigned machine_readers(unsigned one_load, unsigned ranks, bool from_page_cache, unsigned cores);

// One submission's share: the machine's readers over the processes reading at once and the
// rounds each has in flight; at least one.
unsigned submission_readers(unsigned machine, unsigned processes, unsigned rounds_at_once);

}  // namespace ferry::detail
