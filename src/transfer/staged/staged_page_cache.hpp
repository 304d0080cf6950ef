// Page-cache DMA inside a staged run (TransferOptions::page_cache_pin_bytes): which files copy to
// the GPU straight from a registered page-cache mapping (page_cache_registry.hpp) instead of
// being read into staging, and what their statistics say.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ferry/device.hpp"
#include "ferry/io_types.hpp"
#include "services/page_cache_registry.hpp"
#include "transfer/staged/staged_plan.hpp"
#include "transfer/ticket_state.hpp"

namespace ferry::detail {

struct PageCacheFile {
  PageCacheRegistry::Lease lease;  // empty: the file takes the staged path
  std::string why_not;             // then why; empty where no extent names the file
  bool registered_now = false;     // this run mapped and registered it
  double register_seconds = 0;
  std::atomic<std::uint64_t> bytes{0};  // copied from the mapping
};

// One entry per file of the set, for a file -> memory submission with the option on; null where
// it is off or the direction is memory -> file. A file whose extents land only in memory the
// process registry does not serve (host memory, for the CUDA driver's) is not registered.
std::unique_ptr<PageCacheFile[]> lease_page_cache(const TicketState& t);

// Whether [offset, offset + size) of file `file` is copied from its mapping: it has a lease and
// the range lies within the size the file had when registered (never a byte past it).
inline bool from_page_cache(const PageCacheFile* files, std::uint32_t file, std::uint64_t offset,
                            std::uint64_t size) {
  if (files == nullptr || !files[file].lease) return false;
  const std::uint64_t mapped = files[file].lease.size();
  return offset <= mapped && size <= mapped - offset;
}

// Whether every extent of the submission copies from a mapping (then the run needs no staging).
bool all_from_page_cache(const TicketState& t, const PageCacheFile* files);

// One copy out of a page-cache mapping: bytes contiguous in the file and in memory on one device.
struct CopyRun {
  Device device;
  std::uintptr_t memory = 0;
  const std::byte* source = nullptr;
  std::uint64_t size = 0;
  std::uint32_t first_piece = 0, last_piece = 0;  // the pieces it carries bytes of
};

// Appends the copies of piece `p` (index `piece` of the plan) of extent `x`, whose first byte
// sits at `source` in the mapping, to `runs`, extending the last run where the bytes continue it
// in the file and in memory on the same device (holes are skipped).
void add_copy_runs(const Extent& x, const Piece& p, std::uint32_t piece, const std::byte* source,
                   std::vector<CopyRun>& runs);

// The statistics of file `path` that copied from its mapping.
FileLoadStats page_cache_file_stats(const PageCacheFile& f, const std::filesystem::path& path);

}  // namespace ferry::detail
