#include "load/ticket_wait.hpp"

namespace ferry::detail {

void wait_for_load(Ticket& ticket, const LoadOptions& options) {
  if (options.keep_going)
    while (!ticket.wait_for(0.05))
      if (!options.keep_going()) {
        ticket.cancel();
        break;
      }
  ticket.wait();
  ticket.rethrow_if_failed();
}

}  // namespace ferry::detail
