// Matching the caller's destinations to a checkpoint before load_into, the way
// torch.nn.Module.load_state_dict matches a state dict: tensors that share memory under several
// names (tied weights: transformers' lm_head.weight is embed_tokens.weight, and the checkpoint
// holds only one of the names) are filled once, from whichever name the checkpoint holds, and
// count as present; names no alias of which the checkpoint holds are missing; checkpoint names
// no destination has are unexpected.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "ferry/checkpoint.hpp"
#include "ferry/loaded_checkpoint.hpp"

namespace ferry {

struct DestinationMatch {
  std::vector<TensorDestination> to_fill;  // for load_into: one per memory, checkpoint names
  std::vector<std::string> missing;        // destination names, in the order given
  std::vector<std::string> unexpected;     // checkpoint names, in read order
};

// Destinations alias one another when they have the same address and capacity (an address of
// nullptr or a capacity of 0 aliases nothing).
DestinationMatch match_destinations(const Checkpoint& checkpoint,
                                    std::span<const TensorDestination> destinations);

}  // namespace ferry
