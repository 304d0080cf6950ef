// One face for the copies between staging and memory: memcpy for host memory, asynchronous
// copies on a cached stream for a GPU. A worker fences the copies out of (or into) a staging
// slot and waits on the fence before reusing the slot; for host memory both are no-ops.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "ferry/device.hpp"

namespace ferry::detail {

class Event;
class Stream;

// Streams that the workers of one submission share (TransferOptions::copy_streams), borrowed from
// the process's pool per device at first need and given back, drained by the copiers that used
// them, when the submission ends.
class CopyStreams {
 public:
  explicit CopyStreams(unsigned count) : _count(count) {}
  CopyStreams(const CopyStreams&) = delete;
  CopyStreams& operator=(const CopyStreams&) = delete;
  ~CopyStreams();
  // Stream `worker % count` of device `ordinal`, whose context the caller made current.
  Stream* stream(int ordinal, unsigned worker);

 private:
  unsigned _count;
  std::mutex _mutex;
  std::map<int, std::vector<Stream*>> _streams;
};

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
  // A timed copier (see make_copier): after drain(), each fenced run of copies as (start, end)
  // seconds after `reference`, a timed event recorded before any copy; empty otherwise.
  virtual std::vector<std::pair<double, double>> timed_copies(const Event& /*reference*/) {
    return {};
  }
  // Records `reference` (a timed event) on this copier's stream.
  virtual void record(Event& /*reference*/) {}
};

// For memory on `device`, with `slots` fences. A GPU copier borrows a stream of the device and
// events from the process's pools (kept between submissions) and gives them back when dropped.
// A timed one also records a timed event before and after each fenced run of copies (a
// diagnostic: two driver calls more per fence). With `shared`, it queues on the shared stream of
// `worker` instead of a stream of its own.
std::unique_ptr<Copier> make_copier(const Device& device, unsigned slots, bool timed = false,
                                    CopyStreams* shared = nullptr, unsigned worker = 0);

}  // namespace ferry::detail
