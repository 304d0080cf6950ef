// The cuFile entry of the backend table where cuFile cannot exist (Windows: NVIDIA ships
// GPUDirect Storage for Linux only). It stays in the table so that `--backend cufile` is answered
// with the reason instead of an unknown name; DirectStorage is Windows' direct path.
#include "ferry/error.hpp"
#include "transfer/backend.hpp"

namespace ferry::detail {
namespace {

constexpr const char* kWhy =
    "cuFile (GPUDirect Storage) is not available on Windows: NVIDIA ships it for Linux only; "
    "the direct path on Windows is --backend directstorage";

class CufileUnavailable final : public TransferBackend {
 public:
  std::string_view name() const override { return "cufile"; }
  Verdict probe(const FileSet&, const Device&, const TransferOptions&) const override {
    return {false, "cufile", kWhy, true};
  }
  void start(const std::shared_ptr<TicketState>&) const override {
    fail<std::logic_error>("internal error: the cufile backend was started on Windows");
  }
};

}  // namespace

const TransferBackend& cufile_backend() {
  static const CufileUnavailable backend;
  return backend;
}

// Nothing to register without cuFile.
RegisteredBuffer::RegisteredBuffer(std::uintptr_t base, std::uint64_t) : _base(base) {}
RegisteredBuffer::~RegisteredBuffer() = default;

}  // namespace ferry::detail
