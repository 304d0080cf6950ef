// A residency cache of MoE experts: every expert (a group of tensors of one byte layout) lives
// off the GPU, and a fixed number of GPU slots keep the recently or frequently used ones. A step
// acquires the experts its router chose: hits cost nothing, misses are copied in (demand loads
// first, then speculative prefetches into slots no requested expert needs), and the compute
// stream waits on the device for exactly the copies it needs. Released experts stay resident
// until evicted; a slot is refilled only after the compute stream's work queued before the fill
// (the last reads of the evicted expert included). Same sources and ordering as WeightStream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ferry/weight_stream.hpp"

namespace ferry {

enum class EvictionPolicy {
  Lru,       // the least recently used unpinned expert goes
  Frequency  // the least often used goes (counts halve every 1,024 uses), ties by recency
};

class ExpertCache {
 public:
  // `slots` GPU slots for `experts`, which must share one byte layout. `slot_memory`: the
  // caller's memory, one address per slot of slot_layout(experts[0]).bytes each; empty: the
  // cache allocates it. Throws std::invalid_argument for no experts, differing layouts, 0
  // slots or more slots than experts.
  ExpertCache(std::vector<StreamGroup> experts, unsigned slots, StreamOptions options,
              EvictionPolicy policy = EvictionPolicy::Lru,
              std::vector<std::uintptr_t> slot_memory = {});
  ExpertCache(const ExpertCache&) = delete;
  ExpertCache& operator=(const ExpertCache&) = delete;
  ~ExpertCache();

  std::size_t expert_count() const noexcept;
  std::size_t slot_count() const noexcept;
  std::uintptr_t slot_address(std::size_t slot) const;
  std::uint64_t slot_bytes() const;
  // The slot of `expert`, or -1 where it is not resident.
  long resident_slot(std::size_t expert) const;
  void* host_address(std::size_t expert, std::size_t tensor) const;

  // Makes `experts` (distinct, at most slot_count()) resident and the compute stream wait for
  // them; returns their slots, in order. They are pinned (never evicted) until release().
  // `speculative` experts are then loaded into slots that hold no pinned expert, least valuable
  // first, as long as such slots remain; they are not waited for. Throws std::invalid_argument
  // for an expert out of range, a duplicate or more experts than slots.
  std::vector<std::size_t> acquire(std::span<const std::size_t> experts, void* compute_stream,
                                   std::span<const std::size_t> speculative = {});
  // Unpins `experts`; the compute stream's queued work is their last use so far.
  void release(std::span<const std::size_t> experts);
  void join(void* compute_stream);
  void synchronize();

  StreamStats stats() const;

 private:
  std::size_t victim(const std::vector<bool>& taken) const;
  void touch(std::size_t slot);

  EvictionPolicy _policy;
  std::vector<long> _slot_of;  // per expert, -1 where absent
  std::vector<detail::Slot> _slots;
  std::vector<std::uint64_t> _last_use, _uses;  // per slot
  std::vector<unsigned> _pins;                  // per slot
  std::uint64_t _clock = 0;
  std::vector<std::shared_ptr<void>> _owned;
  std::unique_ptr<detail::SlotFiller> _filler;
};

}  // namespace ferry
