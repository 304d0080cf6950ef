#include "fanout/machine_readers.hpp"

#include <algorithm>

#include "io/source_file.hpp"
#include "services/worker_pool.hpp"

namespace ferry::detail {

bool reads_from_page_cache(const FileSet& set, std::span<const std::uint32_t> files) {
  if (!page_cache_residency_measured()) return false;
  double resident = 0, total = 0;
  for (const std::uint32_t f : files) {
    const auto size = static_cast<double>(set.size_at_open(f));
    resident += size * set.acquire(f, false)->residency(kResidencyMaxAge);
    total += size;
  }
  return total == 0 || resident >= kBufferedFromResidency * total;
}

ReaderShare share_readers(unsigned one_load, unsigned ranks, unsigned processes,
                          unsigned rounds_at_once, bool from_page_cache, unsigned cores) {
  ranks = std::max(1u, ranks);
  processes = std::max(1u, processes);
  ReaderShare share;
  share.machine =
      from_page_cache
          ? std::min({kMaxWorkerThreads, std::max(1u, one_load) * ranks, std::max(cores, ranks)})
          : kStorageReaders;
  share.per_submission = std::max(1u, share.machine / (processes * std::max(1u, rounds_at_once)));
  return share;
}

}  // namespace ferry::detail
