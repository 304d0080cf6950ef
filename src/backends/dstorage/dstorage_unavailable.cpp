// The DirectStorage entry of the backend table where DirectStorage cannot exist (it is a Windows
// API): `--backend directstorage` is answered with the reason, and falls back to the staged path
// only when allowed (the route says so per file).
#include "shim/dstorage_availability.hpp"
#include "ferry/error.hpp"
#include "transfer/backend.hpp"

namespace ferry {
namespace dstorage {

const Availability& availability() {
  static const Availability a{false,
                              "DirectStorage is a Windows API (dstorage.dll); on this system "
                              "the direct path is cuFile (--backend cufile)"};
  return a;
}

}  // namespace dstorage

namespace detail {
namespace {

class DirectStorageUnavailable final : public TransferBackend {
 public:
  std::string_view name() const override { return "directstorage"; }
  Verdict probe(const FileSet&, const Device&, const TransferOptions&) const override {
    return {false, "directstorage", dstorage::availability().reason, true};
  }
  void start(const std::shared_ptr<TicketState>&) const override {
    fail<std::logic_error>("internal error: the directstorage backend was started without it");
  }
};

}  // namespace

const TransferBackend& dstorage_backend() {
  static const DirectStorageUnavailable backend;
  return backend;
}

}  // namespace detail
}  // namespace ferry
