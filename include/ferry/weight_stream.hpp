// Weight streaming: groups of tensors (a layer, an expert) that live off the GPU (in ferry's
// pinned host arena, or in checkpoint files) and are copied into static GPU slots just before
// they are used. Groups with the same byte layout (the same tensor sizes, in order) share P
// slots: the k-th group of a layout uses slot k mod P, so the copy of group k+P can start as soon
// as group k is done, while groups k+1 .. k+P-1 compute.
//
// Ordering is kept on the device, never by a host sync: the copies run on one copy stream of the
// stream; before filling a slot, the copy stream waits on an event recorded on the caller's
// compute stream at that point (the slot's previous group may still be read by queued kernels);
// the compute stream waits on the slot's "ready" event before using its group. Under CUDA graph
// capture of the compute stream, a copy issued during the capture joins the capture (its events
// are recorded in it), waits for copies issued before the capture are skipped (the capturing
// caller synchronised first, as torch.cuda.graph does), and join() ends every fork before the
// capture ends. The contract: capture whole passes over the groups, in order, as a model's step.
//
// With a cpu device the slots are host memory and every copy is synchronous, so the logic runs
// and is tested without a GPU. A stream (and an ExpertCache) serves one caller thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ferry/device.hpp"
#include "ferry/file_set.hpp"
#include "ferry/transfer.hpp"

namespace ferry {

// One tensor of a group: its bytes, and where they come from.
struct StreamTensor {
  std::uint64_t size = 0;
  // Host source: the bytes, copied into ferry's arena when the stream is made; null: the caller
  // writes them into host_address() before the group is first used.
  const void* host = nullptr;
  // File source: the range of file `file` of the stream's file set.
  std::uint32_t file = 0;
  std::uint64_t file_offset = 0;
};

struct StreamGroup {
  std::vector<StreamTensor> tensors;
};

enum class StreamSource {
  Host,  // ferry's own arena, pinned where the device is a GPU: one copy per group
  Files  // read through the transfer core (O_DIRECT -> pinned staging -> GPU) at every use
};

struct StreamOptions {
  Device device = Device::cpu();
  StreamSource source = StreamSource::Host;
  std::shared_ptr<const FileSet> files;  // the files of the Files source
  TransferOptions transfer;              // how the Files source reads
};

// What a stream or cache did since it was made.
struct StreamStats {
  std::uint64_t fills = 0;          // group copies into slots
  std::uint64_t bytes = 0;          // bytes copied into slots
  std::uint64_t demand_fills = 0;   // fills started by a wait that found its group absent
  std::uint64_t hits = 0;           // uses that found their group already in its slot
  std::uint64_t misses = 0;         // uses that did not (the expert cache's loads)
  std::uint64_t evictions = 0;      // groups dropped from a slot to make room
  std::uint64_t skipped_waits = 0;  // capture-boundary waits left to the capture's ordering
};

// Tensor offsets inside a slot: 256-byte aligned, in group order. The slot size is the last end.
struct SlotLayout {
  std::vector<std::uint64_t> offsets;
  std::uint64_t bytes = 0;
};
SlotLayout slot_layout(const StreamGroup& group);

namespace detail {
class SlotFiller;
struct Slot;
}  // namespace detail

class WeightStream {
 public:
  // The bytes of each slot a stream of these groups with prefetch distance `prefetch` needs, in
  // slot order: for each layout, in order of its first group, min(prefetch, its groups) slots.
  // Throws std::invalid_argument for no groups, an empty group, a prefetch distance of 0 or
  // larger than the group count.
  static std::vector<std::uint64_t> slot_sizes(const std::vector<StreamGroup>& groups,
                                               unsigned prefetch);

  // `slot_memory`: the caller's memory for each slot (slot_sizes() bytes, on options.device,
  // 256-byte aligned), kept alive by the caller for the stream's life; empty: the stream
  // allocates it. Host-source bytes given in `groups` are copied now. Throws
  // std::invalid_argument for bad groups or options (a file index outside the set, a Files
  // source without files), CudaError where the GPU refuses.
  WeightStream(std::vector<StreamGroup> groups, unsigned prefetch, StreamOptions options,
               std::vector<std::uintptr_t> slot_memory = {});
  WeightStream(const WeightStream&) = delete;
  WeightStream& operator=(const WeightStream&) = delete;
  // Waits for every copy in flight (slots and staging are never freed under one).
  ~WeightStream();

  std::size_t group_count() const noexcept;
  unsigned prefetch() const noexcept { return _prefetch; }
  std::size_t slot_count() const noexcept;
  std::size_t slot_of(std::size_t group) const;
  std::uint64_t slot_bytes(std::size_t slot) const;
  std::uintptr_t slot_address(std::size_t slot) const;
  // Where tensor `tensor` of `group` is while the group is in its slot.
  std::uintptr_t tensor_address(std::size_t group, std::size_t tensor) const;
  // Host source: where the arena keeps the tensor's bytes (to fill it, see StreamTensor::host).
  void* host_address(std::size_t group, std::size_t tensor) const;

  // `compute_stream` below is the caller's CUstream (cast to void*; null: the legacy default
  // stream), ignored for a cpu device.
  // Starts the first groups of every slot (the first P of each layout).
  void prime(void* compute_stream);
  // Makes the compute stream wait until `group` is in its slot; starts its copy first where it
  // is neither there nor on its way (a demand fill). Rethrows a failed file read.
  void wait(std::size_t group, void* compute_stream);
  // The compute stream's work queued so far is the last to use `group`: its slot is refilled
  // with the group that uses it next (cyclically, so the last groups refill the first).
  void release(std::size_t group, void* compute_stream);
  // Makes the compute stream wait for every copy issued during the current capture that no
  // wait() joined yet; nothing outside a capture. Call once at the end of a captured pass.
  void join(void* compute_stream);
  // Blocks the host until every copy issued so far has landed.
  void synchronize();

  StreamStats stats() const;

 private:
  unsigned _prefetch;
  std::vector<std::size_t> _slot_of;       // per group
  std::vector<std::size_t> _next_in_slot;  // per group: the group its slot takes next
  std::vector<detail::Slot> _slots;
  std::vector<std::shared_ptr<void>> _owned;  // slot memory the stream allocated
  std::unique_ptr<detail::SlotFiller> _filler;
};

}  // namespace ferry
