// One face for the copies between staging and memory: memcpy for host memory, asynchronous
// copies on a cached stream for a GPU. A worker fences the copies out of (or into) a staging
// slot and waits on the fence before reusing the slot; for host memory both are no-ops.
#pragma once

#include <cstdint>
#include <memory>

#include "ferry/device.hpp"

namespace ferry::detail {

class Event;

// An event of the process's pool, given back to it when dropped: making one is a driver call,
// which a small submission should not pay.
struct EventReturn {
  int ordinal = 0;
  void operator()(Event* event) const noexcept;
};
using PooledEvent = std::unique_ptr<Event, EventReturn>;

class Copier {
 public:
  virtual ~Copier() = default;
  // staging -> memory (the second half of a file -> memory transfer)
  virtual void put(std::uintptr_t memory, const std::byte* staging, std::uint64_t size) = 0;
  // memory -> staging
  virtual void get(std::byte* staging, std::uintptr_t memory, std::uint64_t size) = 0;
  // Marks the copies queued so far as slot `slot`'s.
  virtual void fence(unsigned slot) = 0;
  // Returns once slot `slot`'s fenced copies have finished.
  virtual void wait(unsigned slot) = 0;
  // Later copies start only after the caller's CUevent `event` fires.
  virtual void after(void* event) = 0;
  // An event recorded behind every copy queued so far; empty for host memory.
  virtual PooledEvent mark_end() = 0;
  // Waits for every queued copy; never throws (a failed copy was reported when queued).
  virtual void drain() noexcept = 0;
};

// For memory on `device`, with `slots` fences. A GPU copier uses this thread's cached stream
// for the device (kept between submissions) and pooled events.
std::unique_ptr<Copier> make_copier(const Device& device, unsigned slots);

// Makes this thread's stream for `device` wait for `event` (a CUevent); on the host, waits.
void wait_for_event(const Device& device, void* event);

}  // namespace ferry::detail
