// How many reader threads a group load runs where the engine chooses them. A machine's storage
// and cores serve every rank it holds, whether one process reads for all its devices or one
// process per rank reads its own share: the machine's readers are counted together, then split
// between the processes (and, from the page cache, the rounds each has reading at once).
#pragma once

#include <cstdint>
#include <span>

#include "ferry/file_set.hpp"

namespace ferry::detail {

// Reads from storage the machine keeps in flight: the depth at which one load's 16 readers of
// 4 MiB read a cold virtio disk at 1.02 x raw O_DIRECT (H100 hosts); 4 ranks x 16 each fell to
// 0.8 x of 4 x 4 on the CPU machine's virtio disk.
inline constexpr unsigned kStorageReaders = 16;

// Whether the reads of `files` (indices into `set`) come mostly from the page cache (at least
// half their bytes resident, as a load chooses buffered reads over O_DIRECT per file): memory
// copies on the reading cores. Otherwise they come from the one storage device.
bool reads_from_page_cache(const FileSet& set, std::span<const std::uint32_t> files);

struct ReaderShare {
  unsigned machine = 1;         // the machine's readers for this load
  unsigned per_submission = 1;  // one process's round: its share, at least one
};

// The machine's readers: from storage kStorageReaders; from the page cache one load's
// (`one_load`) per device of `ranks`, at most the machine's cores (waiting copies spin;
// page-cache copies compete for the cores and memory). Split between the `processes` reading at
// once and the rounds each has in flight.
ReaderShare share_readers(unsigned one_load, unsigned ranks, unsigned processes,
                          unsigned rounds_at_once, bool from_page_cache, unsigned cores);

}  // namespace ferry::detail
