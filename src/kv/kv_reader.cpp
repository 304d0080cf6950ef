// A reader's checksum failure beside a live writer. The writer evicts a block by reusing its
// slot: it writes the new block's bytes, syncs, and only then commits the record that drops
// the old key. A reader whose view still maps the old key to that slot reads the new bytes and
// sees a mismatch that is no corruption. So before calling a block corrupt, a reader takes the
// writer's newer commits (a refresh), a few times with a growing pause to let a put in flight
// commit: where the key left the slot (or changed checksum) the block is a plain miss; where it
// still maps there, the block is read again, and only a mismatch that persists is corruption.
#include <chrono>
#include <mutex>
#include <thread>

#include "kv/kv_store_impl.hpp"

namespace ferry {

namespace {

// Pauses of 2, 4, ... 1024 ms: about 2 s in all, far above a put's write, sync and commit.
constexpr int kRechecks = 10;
constexpr std::chrono::milliseconds kFirstPause{2};

}  // namespace

std::vector<bool> KVStore::Impl::recheck_mismatches(const std::vector<KVKey>& keys,
                                                    const std::vector<std::uint32_t>& slots,
                                                    std::vector<BlockRequest>& requests) {
  std::vector<bool> moved(requests.size(), false);
  std::vector<std::size_t> suspects;
  for (std::size_t w = 0; w < requests.size(); ++w)
    if (requests[w].outcome == BlockOutcome::checksum_mismatch) suspects.push_back(w);
  auto pause = kFirstPause;
  for (int round = 0; round < kRechecks && !suspects.empty(); ++round, pause *= 2) {
    std::this_thread::sleep_for(pause);
    catch_up();
    std::vector<std::size_t> still;
    {
      std::lock_guard lock(mutex);
      for (std::size_t w : suspects) {
        const std::uint32_t slot = index->find(keys[w]);
        if (slot != slots[w] || index->slot(slot).checksum != requests[w].checksum)
          moved[w] = true;
        else
          still.push_back(w);
      }
    }
    if (still.empty()) break;
    std::vector<BlockRequest> again;
    for (std::size_t w : still) {
      BlockRequest r = requests[w];
      r.outcome = BlockOutcome::ok;
      r.message.clear();
      again.push_back(std::move(r));
    }
    io->read(again);
    suspects.clear();
    for (std::size_t k = 0; k < still.size(); ++k) {
      requests[still[k]] = std::move(again[k]);
      if (requests[still[k]].outcome == BlockOutcome::checksum_mismatch)
        suspects.push_back(still[k]);
    }
  }
  return moved;
}

}  // namespace ferry
