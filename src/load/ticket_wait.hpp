// Waiting for a load's submission the way every loader does: cancellable through the caller's
// keep_going, failures rethrown as their own types.
#pragma once

#include "ferry/load_options.hpp"
#include "ferry/transfer.hpp"

namespace ferry::detail {

// Until every copy of the ticket landed (so staging and memory are free to go). Polls
// options.keep_going every 50 ms, cancelling the rest when it says stop; then rethrows the first
// failure, or ferry::Cancelled.
void wait_for_load(Ticket& ticket, const LoadOptions& options);

}  // namespace ferry::detail
