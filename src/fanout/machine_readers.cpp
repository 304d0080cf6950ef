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

unsigned machine_readers(unsigned one_load, unsigned ranks, bool from_page_cache, unsigned cores) {
  one_load = std::max(1u, one_load);
  if (!from_page_cache) return one_load;
  return std::min({kMaxWorkerThreads, one_load * std::max(1u, ranks), std::max(cores, ranks)});
}

unsigned submission_readers(unsigned machine, unsigned processes, unsigned rounds_at_once) {
  return std::max(1u, machine / (std::max(1u, processes) * std::max(1u, rounds_at_once)));
}

}  // namespace ferry::detail
