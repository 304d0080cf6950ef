#include "load/destination_match.hpp"

#include <map>
#include <unordered_set>
#include <utility>

namespace ferry {

DestinationMatch match_destinations(const Checkpoint& checkpoint,
                                    std::span<const TensorDestination> destinations) {
  // Alias groups in first-seen order; a destination without memory is a group of its own.
  std::vector<std::vector<const TensorDestination*>> groups;
  std::map<std::pair<const void*, std::uint64_t>, std::size_t> group_of_memory;
  std::unordered_set<std::string> named;
  for (const auto& d : destinations) {
    named.insert(d.name);
    if (d.data == nullptr || d.capacity == 0) {
      groups.push_back({&d});
      continue;
    }
    const auto [it, fresh] = group_of_memory.emplace(std::pair(d.data, d.capacity), groups.size());
    if (fresh) groups.emplace_back();
    groups[it->second].push_back(&d);
  }
  DestinationMatch match;
  for (const auto& group : groups) {
    const TensorDestination* held = nullptr;
    for (const auto* d : group)
      if (checkpoint.find(d->name) != nullptr) {
        held = d;
        break;
      }
    if (held != nullptr) {
      match.to_fill.push_back(*held);
    } else {
      for (const auto* d : group) match.missing.push_back(d->name);
    }
  }
  for (const auto& t : checkpoint.tensors())
    if (!named.contains(t.name)) match.unexpected.push_back(t.name);
  return match;
}

}  // namespace ferry
