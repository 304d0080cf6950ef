#include "transfer/staging_cache.hpp"

#include <mutex>

namespace ferry::detail {
namespace {

struct Kept {
  std::mutex mutex;
  HostBuffer buffer;
};

// Never destroyed, on purpose: unregistering pinned memory from a static destructor could call
// into a CUDA driver that has already shut down. The process's exit frees the memory.
Kept& kept() {
  static Kept* state = new Kept;
  return *state;
}

}  // namespace

HostBuffer take_staging(std::size_t bytes, const PrimaryContext* pin_in) {
  {
    std::lock_guard lock(kept().mutex);
    HostBuffer& k = kept().buffer;
    if (k.data() != nullptr && k.size() >= bytes && k.pinned() == (pin_in != nullptr))
      return std::move(k);
  }
  return HostBuffer(bytes, pin_in);
}

void keep_staging(HostBuffer buffer) {
  std::lock_guard lock(kept().mutex);
  if (buffer.size() >= kept().buffer.size()) std::swap(kept().buffer, buffer);
  // `buffer` now holds the smaller one, freed when it goes out of scope.
}

void release_staging() {
  HostBuffer freed;
  {
    std::lock_guard lock(kept().mutex);
    std::swap(kept().buffer, freed);
  }
}

}  // namespace ferry::detail
