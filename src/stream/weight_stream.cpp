#include "ferry/weight_stream.hpp"

#include <map>
#include <optional>
#include <utility>

#include "ferry/error.hpp"
#include "stream/slot_filler.hpp"

namespace ferry {
namespace {

// Groups of one byte layout share slots: the layout's key is its tensor sizes, in order.
using LayoutKey = std::vector<std::uint64_t>;

LayoutKey layout_key(const StreamGroup& group) {
  LayoutKey key;
  for (const auto& t : group.tensors) key.push_back(t.size);
  return key;
}

struct SlotPlan {
  std::vector<std::uint64_t> slot_bytes;
  std::vector<std::size_t> slot_of, next_in_slot;
  std::vector<std::size_t> first_group;  // per slot
};

SlotPlan plan_slots(const std::vector<StreamGroup>& groups, unsigned prefetch) {
  FERRY_EXPECT(!groups.empty(), std::invalid_argument, "weight stream: no groups given");
  FERRY_EXPECT(prefetch >= 1, std::invalid_argument,
               "weight stream: a prefetch distance of 0; it must be at least 1");
  FERRY_EXPECT(prefetch <= groups.size(), std::invalid_argument,
               "weight stream: a prefetch distance of ", prefetch, " is larger than the ",
               groups.size(), " groups streamed");
  std::map<LayoutKey, std::size_t> class_of;
  std::vector<std::vector<std::size_t>> members;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    FERRY_EXPECT(!groups[g].tensors.empty(), std::invalid_argument, "weight stream: group ", g,
                 " has no tensors");
    auto [it, added] = class_of.emplace(layout_key(groups[g]), members.size());
    if (added) members.emplace_back();
    members[it->second].push_back(g);
  }
  SlotPlan plan;
  plan.slot_of.resize(groups.size());
  plan.next_in_slot.resize(groups.size());
  for (const auto& m : members) {
    const std::size_t n = m.size();
    const std::size_t slots = std::min<std::size_t>(prefetch, n);
    const std::size_t base = plan.slot_bytes.size();
    for (std::size_t s = 0; s < slots; ++s) {
      plan.slot_bytes.push_back(slot_layout(groups[m[0]]).bytes);
      plan.first_group.push_back(m[s]);
    }
    for (std::size_t r = 0; r < n; ++r) {
      plan.slot_of[m[r]] = base + r % slots;
      plan.next_in_slot[m[r]] = r + slots < n ? m[r + slots] : m[r % slots];  // wraps to the
      // slot's first group: the next pass
    }
  }
  return plan;
}

}  // namespace

std::vector<std::uint64_t> WeightStream::slot_sizes(const std::vector<StreamGroup>& groups,
                                                    unsigned prefetch) {
  return plan_slots(groups, prefetch).slot_bytes;
}

WeightStream::WeightStream(std::vector<StreamGroup> groups, unsigned prefetch,
                           StreamOptions options, std::vector<std::uintptr_t> slot_memory)
    : _prefetch(prefetch) {
  SlotPlan plan = plan_slots(groups, prefetch);
  FERRY_EXPECT(slot_memory.empty() || slot_memory.size() == plan.slot_bytes.size(),
               std::invalid_argument, "weight stream: ", slot_memory.size(),
               " slot addresses given for ", plan.slot_bytes.size(), " slots");
  _slot_of = std::move(plan.slot_of);
  _next_in_slot = std::move(plan.next_in_slot);
  _filler = std::make_unique<detail::SlotFiller>(std::move(groups), std::move(options));
  _slots.resize(plan.slot_bytes.size());
  for (std::size_t s = 0; s < _slots.size(); ++s)
    _filler->init_slot(_slots[s], slot_memory.empty() ? 0 : slot_memory[s], plan.slot_bytes[s],
                       _owned);
}

WeightStream::~WeightStream() {
  // A garbage collector may drop a stream while another model is being captured: the syncs and
  // frees below, none of them part of that capture, must not invalidate it.
  std::optional<detail::RelaxedCaptureMode> relaxed;
  if (_filler->gpu()) relaxed.emplace();
  synchronize();
  _slots.clear();
  _filler.reset();
  _owned.clear();
}

std::size_t WeightStream::group_count() const noexcept { return _slot_of.size(); }
std::size_t WeightStream::slot_count() const noexcept { return _slots.size(); }

std::size_t WeightStream::slot_of(std::size_t group) const {
  FERRY_EXPECT(group < _slot_of.size(), std::invalid_argument, "weight stream: group ", group,
               " of ", _slot_of.size());
  return _slot_of[group];
}

std::uint64_t WeightStream::slot_bytes(std::size_t slot) const {
  FERRY_EXPECT(slot < _slots.size(), std::invalid_argument, "weight stream: slot ", slot, " of ",
               _slots.size());
  return _slots[slot].bytes;
}

std::uintptr_t WeightStream::slot_address(std::size_t slot) const {
  FERRY_EXPECT(slot < _slots.size(), std::invalid_argument, "weight stream: slot ", slot, " of ",
               _slots.size());
  return _slots[slot].memory;
}

std::uintptr_t WeightStream::tensor_address(std::size_t group, std::size_t tensor) const {
  const std::size_t slot = slot_of(group);  // checks the group
  const auto& layout = _filler->layout(group);
  FERRY_EXPECT(tensor < layout.offsets.size(), std::invalid_argument, "weight stream: group ",
               group, " has no tensor ", tensor);
  return _slots[slot].memory + layout.offsets[tensor];
}

void* WeightStream::host_address(std::size_t group, std::size_t tensor) const {
  return _filler->host_address(group, tensor);
}

void WeightStream::prime(void* compute_stream) {
  for (std::size_t g = 0; g < _slot_of.size(); ++g) {
    detail::Slot& slot = _slots[_slot_of[g]];
    if (slot.group < 0) _filler->fill(slot, g, compute_stream);
  }
}

void WeightStream::wait(std::size_t group, void* compute_stream) {
  detail::Slot& slot = _slots[slot_of(group)];
  if (slot.group != static_cast<long>(group)) {
    ++_filler->stats().demand_fills;
    ++_filler->stats().misses;
    _filler->fill(slot, group, compute_stream);
  } else {
    ++_filler->stats().hits;
  }
  _filler->await(slot, compute_stream);
}

void WeightStream::release(std::size_t group, void* compute_stream) {
  detail::Slot& slot = _slots[slot_of(group)];
  const std::size_t next = _next_in_slot[group];
  if (slot.group == static_cast<long>(next)) return;  // resident for good, or already on its way
  _filler->fill(slot, next, compute_stream);
}

void WeightStream::join(void* compute_stream) {
  for (auto& slot : _slots) _filler->join(slot, compute_stream);
}

void WeightStream::synchronize() {
  for (auto& slot : _slots) _filler->synchronize(slot);
}

StreamStats WeightStream::stats() const { return _filler->stats(); }

}  // namespace ferry
