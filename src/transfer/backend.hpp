// The backend table (ggml's idea): each compiled-in data path says whether it can serve a set of
// files for a device (probe) and runs submissions (start). The route picks one per submission.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "ferry/transfer.hpp"

namespace ferry::detail {

struct TicketState;

struct Verdict {
  bool usable = false;
  std::string path;        // the I/O path it would take: "staged", "cufile-gds", "cufile-compat"
  std::string reason;      // why (or why not), in words
  bool no_driver = false;  // unusable because the driver or library is missing (a CudaError)
};

class TransferBackend {
 public:
  virtual ~TransferBackend() = default;
  virtual std::string_view name() const = 0;
  // Whether this backend can move these files to or from memory on `device`.
  virtual Verdict probe(const FileSet& files, const Device& device,
                        const TransferOptions& options) const = 0;
  // Starts the submission on the worker pool and returns; the ticket completes it.
  virtual void start(const std::shared_ptr<TicketState>& ticket) const = 0;
};

// The compiled-in backends, the preferred first: cuFile, DirectStorage, then staged. Where one
// cannot exist (cuFile on Windows, DirectStorage elsewhere) its entry says so when probed.
std::span<const TransferBackend* const> backends();
const TransferBackend& staged_backend();
const TransferBackend& cufile_backend();
const TransferBackend& dstorage_backend();

// The route: which backend serves this submission (options.backend, the probes), and a note for
// the statistics when auto passed cuFile over. Throws where options.backend cannot be honoured.
struct Route {
  const TransferBackend* backend = nullptr;
  std::string note;
};
Route choose_route(const FileSet& files, const Device& device, const TransferOptions& options);

// Starts a submission on `backend` (the load route uses this with its own registered buffer).
Ticket start(const TransferBackend& backend, std::shared_ptr<TicketState> state);

}  // namespace ferry::detail

namespace ferry::detail {

// Registers [base, base + bytes) with cuFile for the life of the object, where cuFile allows it
// (a load's own destination allocation).
class RegisteredBuffer {
 public:
  RegisteredBuffer(std::uintptr_t base, std::uint64_t bytes);
  RegisteredBuffer(const RegisteredBuffer&) = delete;
  RegisteredBuffer& operator=(const RegisteredBuffer&) = delete;
  ~RegisteredBuffer();
  std::uintptr_t base() const noexcept { return _registered ? _base : 0; }

 private:
  std::uintptr_t _base;
  bool _registered = false;
};

}  // namespace ferry::detail
