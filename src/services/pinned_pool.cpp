#include "services/pinned_pool.hpp"

#include <algorithm>
#include <utility>

#include "ferry/error.hpp"

namespace ferry::detail {
namespace {

constexpr std::uint64_t kPage = 4096;

std::uint64_t round_to_pages(std::uint64_t bytes) {
  return std::max<std::uint64_t>(kPage, (bytes + kPage - 1) / kPage * kPage);
}

}  // namespace

PinnedPool::Lease::Lease(Lease&& other) noexcept { *this = std::move(other); }

PinnedPool::Lease& PinnedPool::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    if (_slab) _pool->give_back(_slab);
    _pool = other._pool;
    _slab = std::exchange(other._slab, nullptr);
    _pin_in = other._pin_in;
    _slots = std::exchange(other._slots, 0);
    _slot_bytes = other._slot_bytes;
    _stride = other._stride;
  }
  return *this;
}

PinnedPool::Lease::~Lease() {
  if (_slab) _pool->give_back(_slab);
}

void PinnedPool::Lease::pin_slot(unsigned i) {
  // Faulted in here, on this worker, not inside the driver's registration, which other workers'
  // first slots queue behind.
  _slab->buffer.fault_in(i * _stride, _stride);
  _slab->buffer.pin_range(i * _stride, _stride, *_pin_in);
  _slab->pinned_slots[i] = true;
}

PinnedPool::PinnedPool(std::uint64_t bound_bytes) : _bound(bound_bytes) {}

PinnedPool::Lease PinnedPool::lease(std::uint64_t slot_bytes, unsigned wanted, unsigned min_slots,
                                    const PrimaryContext* pin_in) {
  slot_bytes = round_to_pages(slot_bytes);
  min_slots = std::max(1u, min_slots);
  wanted = std::max(wanted, min_slots);
  std::unique_lock lock(_mutex);
  FERRY_EXPECT(slot_bytes * min_slots <= _bound, std::invalid_argument, "staging of ", _bound,
               " bytes cannot hold ", min_slots, " slots of ", slot_bytes, " bytes");
  Lease lease;
  lease._pool = this;
  lease._slot_bytes = slot_bytes;
  lease._pin_in = pin_in;
  const bool gpu = pin_in != nullptr;
  // A GPU slab whose slots hold this lease's is taken as it is registered; anything else is
  // carved (and registered) again in slots of this size.
  const auto kept = [&](const Slab& s) {
    return gpu ? s.slot_bytes >= slot_bytes : s.slot_bytes == slot_bytes;
  };
  const auto capacity = [&](const Slab& s) {
    return s.buffer.size() / (kept(s) ? s.slot_bytes : slot_bytes);
  };
  // A slab kept as it is with every slot wanted, then the most slots: a GPU slab carved again
  // is registered again.
  const auto rank = [&](const Slab& s) {
    return std::pair(kept(s) && capacity(s) >= wanted, capacity(s));
  };
  // A new GPU slab's slots: a page of room where the bound lets every wanted slot have it.
  const auto new_stride = [&](std::uint64_t room) {
    const std::uint64_t roomy = slot_bytes + kPage;
    return gpu && room / roomy >= wanted ? roomy : slot_bytes;
  };
  for (;;) {
    // An idle slab of the right kind that holds at least the minimum, the best ranked.
    Slab* best = nullptr;
    for (auto& s : _slabs)
      if (!s.leased && s.gpu == gpu && capacity(s) >= min_slots && (!best || rank(s) > rank(*best)))
        best = &s;
    if (best && capacity(*best) >= wanted) {
      lease._slots = wanted;
    } else {
      // A new slab, as large as fits beside the others once idle slabs are freed.
      free_idle_locked((slot_bytes + (gpu ? kPage : 0)) * wanted, best);
      const std::uint64_t room = _bound > _held ? _bound - _held : 0;
      const std::uint64_t stride = new_stride(room);
      const auto fits = static_cast<unsigned>(std::min<std::uint64_t>(wanted, room / stride));
      if (fits >= min_slots && (!best || fits > capacity(*best))) {
        _slabs.push_back({HostBuffer(fits * stride, nullptr), gpu, false, stride,
                          std::vector<bool>(gpu ? fits : 0, false)});
        _held += fits * stride;
        _high_water = std::max(_high_water, _held);
        best = &_slabs.back();
      }
      if (best)
        lease._slots = static_cast<unsigned>(std::min<std::uint64_t>(wanted, capacity(*best)));
    }
    if (best) {
      if (!kept(*best)) {
        // Registrations of other slots could put one copy across two: made again.
        if (gpu) best->buffer.unpin();
        best->slot_bytes = slot_bytes;
        best->pinned_slots.assign(gpu ? best->buffer.size() / slot_bytes : 0, false);
      }
      best->leased = true;
      lease._slab = best;
      lease._stride = best->slot_bytes;
      _leased += best->buffer.size();
      break;
    }
    _returned.wait(lock);
  }
  return lease;
}

unsigned PinnedPool::prefill(std::uint64_t slot_bytes, unsigned slots, unsigned count,
                             const PrimaryContext* pin_in) {
  slot_bytes = round_to_pages(slot_bytes);
  slots = std::max(1u, slots);
  const std::uint64_t bytes = slot_bytes * slots;
  unsigned made = 0;
  for (; made < count; ++made) {
    {
      std::lock_guard lock(_mutex);
      if (_held + bytes > _bound) break;
      _held += bytes;  // reserved while it is made, outside the lock
      _high_water = std::max(_high_water, _held);
    }
    Slab slab{HostBuffer(bytes, nullptr), pin_in != nullptr, false, 0, {}};
    try {
      slab.buffer.fault_in(0, bytes);
      if (pin_in) {
        slab.slot_bytes = slot_bytes;
        slab.pinned_slots.assign(slots, false);
        for (unsigned i = 0; i < slots; ++i) {
          slab.buffer.pin_range(i * slot_bytes, slot_bytes, *pin_in);
          slab.pinned_slots[i] = true;
        }
      }
    } catch (...) {
      std::lock_guard lock(_mutex);
      _held -= bytes;
      throw;
    }
    {
      std::lock_guard lock(_mutex);
      _slabs.push_back(std::move(slab));
    }
    _returned.notify_all();
  }
  return made;
}

void PinnedPool::free_idle_locked(std::uint64_t need, const Slab* keep) {
  for (auto it = _slabs.begin(); it != _slabs.end() && _held + need > _bound;) {
    if (it->leased || &*it == keep) {
      ++it;
      continue;
    }
    _held -= it->buffer.size();
    it = _slabs.erase(it);
  }
}

void PinnedPool::give_back(Slab* slab) {
  {
    std::lock_guard lock(_mutex);
    slab->leased = false;
    _leased -= slab->buffer.size();
    if (_held > _bound) free_idle_locked(0);
  }
  _returned.notify_all();
}

PinnedPool::Stats PinnedPool::stats() const {
  std::lock_guard lock(_mutex);
  return {_bound, _held, _high_water, _leased};
}

std::uint64_t PinnedPool::bound() const {
  std::lock_guard lock(_mutex);
  return _bound;
}

void PinnedPool::set_bound(std::uint64_t bytes) {
  {
    std::lock_guard lock(_mutex);
    _bound = bytes;
    free_idle_locked(0);
  }
  _returned.notify_all();
}

void PinnedPool::release_idle() {
  std::lock_guard lock(_mutex);
  const std::uint64_t bound = _bound;
  _bound = 0;
  free_idle_locked(0);
  _bound = bound;
}

void PinnedPool::reset_high_water() {
  std::lock_guard lock(_mutex);
  _high_water = _held;
}

PinnedPool& staging_pool() {
  static PinnedPool* pool = new PinnedPool(kDefaultStagingLimit);
  return *pool;
}

}  // namespace ferry::detail
