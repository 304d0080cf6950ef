// The process's staging memory: page-aligned host slabs, pinned when a GPU uses them, carved into
// equal slots and handed out by RAII leases. Every transfer (loads, puts, gets) leases from one
// pool, so the bound on staging holds whatever number of them run at once: a lease takes fewer
// slots than it asked for where the rest do not fit (never fewer than its minimum), and waits
// for other leases to end where not even that fits. Idle slabs are kept, so a second transfer
// pays no allocation or pinning; they are freed to make room for a differently shaped lease.
// One lease is taken per worker per submission, so the hot loop never touches the pool's lock.
// A slab for a GPU is pinned slot by slot as its lease first uses each (Lease::ready): in a fresh
// process a worker starts reading once its first slot is pinned, instead of every worker
// waiting for all of its staging (the driver serialises pinning, and the copies other workers
// queue meanwhile wait for it). Its slots stay registered as they are for any later lease of
// slots no larger (a lease's slots may lie further apart than its slot size), and a new one is
// made with a page of room per slot: a read's slot is a page longer than a write's of the same
// chunk (the O_DIRECT tail), so a process's first get after its puts, or a transfer of smaller
// chunks, registers nothing again.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <vector>

#include "cuda/cuda_resources.hpp"

namespace ferry::detail {

class PinnedPool {
  struct Slab {
    HostBuffer buffer;
    bool gpu = false;  // its slots are pinned (as far as they were used) for GPU copies
    bool leased = false;
    // The size of its slots (their stride) and, for a GPU slab, which are pinned. A lease of
    // larger slots (or, on the host, of another size) has them made again (at lease time: no
    // copy uses the slab then).
    std::uint64_t slot_bytes = 0;
    std::vector<bool> pinned_slots;
  };

 public:
  class Lease {
   public:
    Lease() = default;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    ~Lease();

    unsigned slots() const noexcept { return _slots; }
    std::uint64_t slot_bytes() const noexcept { return _slot_bytes; }
    // Page-aligned, slot_bytes() long (the slab's slots may be longer); pinned once ready(i)
    // returned.
    std::byte* slot(unsigned i) const noexcept { return _slab->buffer.data() + i * _stride; }
    // Pins slot i (one registration per slot, so no copy spans two) where the lease is for a
    // GPU and it is not yet (throws CudaError); cheap once it is.
    void ready(unsigned i) {
      if (_pin_in && !_slab->pinned_slots[i]) pin_slot(i);
    }
    // Whether the slab serves GPU copies (its slots pinned before use).
    bool pinned() const noexcept { return _slab && _slab->gpu; }
    bool empty() const noexcept { return _slab == nullptr; }

   private:
    friend class PinnedPool;
    void pin_slot(unsigned i);
    PinnedPool* _pool = nullptr;
    Slab* _slab = nullptr;
    const PrimaryContext* _pin_in = nullptr;
    unsigned _slots = 0;
    std::uint64_t _slot_bytes = 0;
    std::uint64_t _stride = 0;  // the slab's slots
  };

  struct Stats {
    std::uint64_t bound = 0;
    std::uint64_t held_bytes = 0;    // allocated now, leased or kept
    std::uint64_t high_water = 0;    // most ever held at once
    std::uint64_t leased_bytes = 0;  // in leases now
  };

  explicit PinnedPool(std::uint64_t bound_bytes);
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // Between `min_slots` and `wanted` slots of at least `slot_bytes` (rounded up to pages), for
  // copies to and from GPUs when `pin_in` is given: Lease::ready pins each slot in that context
  // before its first use. Waits while not even `min_slots` fit; throws std::invalid_argument
  // where they never can (larger than the bound).
  Lease lease(std::uint64_t slot_bytes, unsigned wanted, unsigned min_slots,
              const PrimaryContext* pin_in);

  // Makes `count` idle slabs of `slots` slots of at least `slot_bytes` ahead of the leases that
  // will ask for that shape (a process's first transfer), each slot pinned for `pin_in` where
  // given, each slab joining the pool once ready: a lease taken meanwhile finds the ready ones
  // and makes what it lacks itself. Stops at the bound; returns the slabs made. Throws CudaError
  // where pinning fails (the slabs made before it stay).
  unsigned prefill(std::uint64_t slot_bytes, unsigned slots, unsigned count,
                   const PrimaryContext* pin_in);

  Stats stats() const;
  std::uint64_t bound() const;
  // Changes the bound; idle slabs over it are freed. Leases already taken keep their memory.
  void set_bound(std::uint64_t bytes);
  // Frees every idle slab.
  void release_idle();
  // Starts the high-water mark again from what is held now (tests measure one phase's peak).
  void reset_high_water();

 private:
  void give_back(Slab* slab);
  // Frees idle slabs (but `keep`) until `need` more bytes fit.
  void free_idle_locked(std::uint64_t need, const Slab* keep = nullptr);

  mutable std::mutex _mutex;
  std::condition_variable _returned;
  std::list<Slab> _slabs;
  std::uint64_t _bound;
  std::uint64_t _held = 0;
  std::uint64_t _leased = 0;
  std::uint64_t _high_water = 0;
};

// The one pool of the process, bounded by kDefaultStagingLimit until set_bound changes it.
// Never destroyed: unpinning from a static destructor could call a CUDA driver already gone.
inline constexpr std::uint64_t kDefaultStagingLimit = 1ull << 30;
PinnedPool& staging_pool();

}  // namespace ferry::detail
