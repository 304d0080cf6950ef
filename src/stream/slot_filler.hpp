// The copy machinery under WeightStream and ExpertCache: the groups' sources (ferry's host
// arena, or file extents), the one copy stream, and the events that order a slot's fill after
// the compute stream's last use of it and the compute stream's use after the fill.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "cuda/cuda_resources.hpp"
#include "ferry/transfer.hpp"
#include "ferry/weight_stream.hpp"

namespace ferry::detail {

// One static slot: memory for one group at a time.
struct Slot {
  std::uintptr_t memory = 0;
  std::uint64_t bytes = 0;
  long group = -1;                     // the group in the slot or on its way; -1: none
  std::unique_ptr<Event> fork, ready;  // GPU only: compute -> copy, copy -> compute
  bool ready_pending = false;          // a fill the compute stream has not waited on yet
  bool in_capture = false;             // the last fill was issued during a graph capture
  Ticket ticket;                       // Files source: the last fill's reads
};

class SlotFiller {
 public:
  // Checks the groups against the source (file indexes and ranges) and, for the Host source,
  // builds the arena (pinned for a GPU) and copies the bytes the groups carry into it.
  SlotFiller(std::vector<StreamGroup> groups, StreamOptions options);
  SlotFiller(const SlotFiller&) = delete;
  SlotFiller& operator=(const SlotFiller&) = delete;
  ~SlotFiller();

  std::size_t group_count() const noexcept { return _layouts.size(); }
  bool gpu() const noexcept { return _options.device.is_cuda(); }
  const SlotLayout& layout(std::size_t group) const { return _layouts.at(group); }
  void* host_address(std::size_t group, std::size_t tensor) const;

  // Slot memory: the caller's (checked for alignment) or allocated here (into `owned`).
  void init_slot(Slot& slot, std::uintptr_t memory, std::uint64_t bytes,
                 std::vector<std::shared_ptr<void>>& owned);
  // Queues `group` into `slot` after the compute stream's work queued so far.
  void fill(Slot& slot, std::size_t group, void* compute_stream);
  // Makes the compute stream wait for the slot's last fill.
  void await(Slot& slot, void* compute_stream);
  // The compute stream waits for the slot's fills issued in the current capture; false where
  // the stream is not capturing.
  void join(Slot& slot, void* compute_stream);
  // The host waits for every fill of the slot; never throws.
  void synchronize(Slot& slot) noexcept;

  StreamStats& stats() noexcept { return _stats; }
  const StreamStats& stats() const noexcept { return _stats; }

 private:
  bool capturing(void* compute_stream) const;
  void refuse_capture(bool captured) const;
  void make_current() const;

  StreamOptions _options;
  std::vector<SlotLayout> _layouts;
  // Host source: the arena, laid out like the slots (one copy per group), and each group's place.
  HostBuffer _arena;
  std::vector<std::uint64_t> _arena_offsets;
  // Files source: each group's extents, span addresses relative to the slot.
  std::vector<std::vector<Extent>> _extents;
  std::unique_ptr<Stream> _copy_stream;  // GPU only
  StreamStats _stats;
};

}  // namespace ferry::detail
