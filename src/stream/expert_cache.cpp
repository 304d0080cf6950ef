#include "ferry/expert_cache.hpp"

#include <limits>
#include <optional>
#include <utility>

#include "ferry/error.hpp"
#include "stream/slot_filler.hpp"

namespace ferry {
namespace {
constexpr std::uint64_t kDecayEvery = 1024;  // uses between halvings of the frequency counts

std::vector<std::uint64_t> sizes(const StreamGroup& group) {
  std::vector<std::uint64_t> out;
  for (const auto& t : group.tensors) out.push_back(t.size);
  return out;
}
}  // namespace

ExpertCache::ExpertCache(std::vector<StreamGroup> experts, unsigned slots, StreamOptions options,
                         EvictionPolicy policy, std::vector<std::uintptr_t> slot_memory)
    : _policy(policy) {
  FERRY_EXPECT(!experts.empty(), std::invalid_argument, "expert cache: no experts given");
  FERRY_EXPECT(slots >= 1 && slots <= experts.size(), std::invalid_argument,
               "expert cache: ", slots, " slots for ", experts.size(), " experts (1 to ",
               experts.size(), ")");
  FERRY_EXPECT(slot_memory.empty() || slot_memory.size() == slots, std::invalid_argument,
               "expert cache: ", slot_memory.size(), " slot addresses given for ", slots, " slots");
  const auto first = sizes(experts[0]);
  for (std::size_t e = 1; e < experts.size(); ++e)
    FERRY_EXPECT(sizes(experts[e]) == first, std::invalid_argument, "expert cache: expert ", e,
                 "'s tensor sizes differ from expert 0's");
  const std::uint64_t bytes = slot_layout(experts[0]).bytes;
  _slot_of.assign(experts.size(), -1);
  _uses.assign(experts.size(), 0);
  _filler = std::make_unique<detail::SlotFiller>(std::move(experts), std::move(options));
  _slots.resize(slots);
  _last_use.assign(slots, 0);
  _pins.assign(slots, 0);
  for (std::size_t s = 0; s < slots; ++s)
    _filler->init_slot(_slots[s], slot_memory.empty() ? 0 : slot_memory[s], bytes, _owned);
}

ExpertCache::~ExpertCache() {
  // As WeightStream's: never invalidates a capture that another model is in.
  std::optional<detail::RelaxedCaptureMode> relaxed;
  if (_filler->gpu()) relaxed.emplace();
  synchronize();
  _slots.clear();
  _filler.reset();
  _owned.clear();
}

std::size_t ExpertCache::expert_count() const noexcept { return _slot_of.size(); }
std::size_t ExpertCache::slot_count() const noexcept { return _slots.size(); }
std::uintptr_t ExpertCache::slot_address(std::size_t slot) const {
  FERRY_EXPECT(slot < _slots.size(), std::invalid_argument, "expert cache: slot ", slot, " of ",
               _slots.size());
  return _slots[slot].memory;
}
std::uint64_t ExpertCache::slot_bytes() const { return _slots.front().bytes; }

long ExpertCache::resident_slot(std::size_t expert) const {
  FERRY_EXPECT(expert < _slot_of.size(), std::invalid_argument, "expert cache: expert ", expert,
               " of ", _slot_of.size());
  return _slot_of[expert];
}

void* ExpertCache::host_address(std::size_t expert, std::size_t tensor) const {
  return _filler->host_address(expert, tensor);
}

void ExpertCache::touch(std::size_t slot) {
  _last_use[slot] = ++_clock;
  ++_uses[static_cast<std::size_t>(_slots[slot].group)];
  if (_clock % kDecayEvery == 0)
    for (auto& u : _uses) u /= 2;
}

// The slot to refill: an empty one first, else the least valuable unpinned one not taken by
// this call; slot_count() where none is left.
std::size_t ExpertCache::victim(const std::vector<bool>& taken) const {
  std::size_t best = _slots.size();
  for (std::size_t s = 0; s < _slots.size(); ++s) {
    if (taken[s] || _pins[s] > 0) continue;
    if (_slots[s].group < 0) return s;
    if (best == _slots.size()) {
      best = s;
      continue;
    }
    const auto uses = [&](std::size_t i) {
      return _uses[static_cast<std::size_t>(_slots[i].group)];
    };
    const bool less = _policy == EvictionPolicy::Frequency && uses(s) != uses(best)
                          ? uses(s) < uses(best)
                          : _last_use[s] < _last_use[best];
    if (less) best = s;
  }
  return best;
}

std::vector<std::size_t> ExpertCache::acquire(std::span<const std::size_t> experts,
                                              void* compute_stream,
                                              std::span<const std::size_t> speculative) {
  // Every argument checked before the cache changes: a refused call changes nothing.
  for (std::size_t e : speculative)
    FERRY_EXPECT(e < _slot_of.size(), std::invalid_argument, "expert cache: speculative expert ", e,
                 " of ", _slot_of.size());
  std::vector<bool> asked(_slot_of.size(), false);
  for (std::size_t e : experts) {
    FERRY_EXPECT(e < _slot_of.size(), std::invalid_argument, "expert cache: expert ", e, " of ",
                 _slot_of.size());
    FERRY_EXPECT(!asked[e], std::invalid_argument, "expert cache: expert ", e,
                 " asked for twice in one acquire");
    asked[e] = true;
  }
  std::size_t free = 0;
  for (std::size_t s = 0; s < _slots.size(); ++s) free += _pins[s] == 0 ? 1 : 0;
  std::size_t needed = 0;
  for (std::size_t e : experts) needed += _slot_of[e] < 0 || _pins[_slot_of[e]] == 0 ? 1 : 0;
  FERRY_EXPECT(needed <= free, std::invalid_argument, "expert cache: ", experts.size(),
               " experts asked for, but only ", free, " of ", _slots.size(),
               " slots are not pinned");

  std::vector<bool> taken(_slots.size(), false);
  std::vector<std::size_t> out(experts.size());
  // Hits first, so that no miss evicts an expert this call needs.
  for (std::size_t i = 0; i < experts.size(); ++i) {
    if (const long s = _slot_of[experts[i]]; s >= 0) {
      out[i] = static_cast<std::size_t>(s);
      taken[out[i]] = true;
      ++_filler->stats().hits;
    }
  }
  auto load = [&](std::size_t expert) {
    const std::size_t s = victim(taken);
    if (s == _slots.size()) return s;
    if (const long old = _slots[s].group; old >= 0) {
      _slot_of[static_cast<std::size_t>(old)] = -1;
      ++_filler->stats().evictions;
    }
    _filler->fill(_slots[s], expert, compute_stream);
    _slot_of[expert] = static_cast<long>(s);
    taken[s] = true;
    return s;
  };
  for (std::size_t i = 0; i < experts.size(); ++i) {
    if (_slot_of[experts[i]] >= 0) continue;
    out[i] = load(experts[i]);
    FERRY_ASSERT(out[i] < _slots.size());
    ++_filler->stats().misses;
  }
  for (std::size_t i = 0; i < experts.size(); ++i) {
    ++_pins[out[i]];
    touch(out[i]);
    _filler->await(_slots[out[i]], compute_stream);
  }
  for (std::size_t e : speculative) {
    if (_slot_of[e] >= 0) continue;
    if (load(e) == _slots.size()) break;
  }
  return out;
}

void ExpertCache::release(std::span<const std::size_t> experts) {
  // Every expert checked before any is released: a refused call changes nothing.
  std::vector<std::size_t> releases(_slots.size(), 0);
  for (std::size_t e : experts) {
    FERRY_EXPECT(e < _slot_of.size() && _slot_of[e] >= 0, std::invalid_argument,
                 "expert cache: expert ", e, " released but not acquired");
    const auto s = static_cast<std::size_t>(_slot_of[e]);
    FERRY_EXPECT(++releases[s] <= _pins[s], std::invalid_argument, "expert cache: expert ", e,
                 " released more often than acquired");
  }
  for (std::size_t s = 0; s < releases.size(); ++s) _pins[s] -= static_cast<unsigned>(releases[s]);
}

void ExpertCache::join(void* compute_stream) {
  for (auto& slot : _slots) _filler->join(slot, compute_stream);
}

void ExpertCache::synchronize() {
  for (auto& slot : _slots) _filler->synchronize(slot);
}

StreamStats ExpertCache::stats() const { return _filler->stats(); }

}  // namespace ferry
