#include "ferry/gds_file.hpp"

#include "cuda/cuda_resources.hpp"
#include "cufile/cufile_files.hpp"
#include "cufile/gds_mode.hpp"
#include "ferry/error.hpp"
#include "platform/system.hpp"

namespace ferry {

struct GdsFile::State {
  std::filesystem::path path;
  std::shared_ptr<detail::PrimaryContext> context;
  detail::HandleCache::Lease lease;
  detail::CuFileVerdict verdict;
};

namespace {
constexpr std::uint64_t kPieceBytes = 8ull << 20;
}

GdsFile GdsFile::open(const std::filesystem::path& path, bool writable, int device,
                      bool allow_compat) {
  auto context = std::make_shared<detail::PrimaryContext>(device);
  context->make_current();
  const detail::CuFileFacts& facts = detail::probe_cufile();
  const detail::CuFileVerdict driver = detail::driver_verdict(facts);
  FERRY_EXPECT(driver.mode != detail::CuFileMode::Unavailable, CudaError, path.string(),
               ": cuFile cannot run: ", driver.reason);
  auto lease = detail::cufile_handles().acquire(path, writable);
  // The file system is known only once the file exists, so the verdict follows the open.
  detail::CuFileVerdict verdict =
      detail::file_verdict(facts, detail::filesystem_name(path.string()));
  FERRY_EXPECT(verdict.mode == detail::CuFileMode::Gds || allow_compat, std::invalid_argument,
               path.string(), ": cuFile would run in compatibility mode (", verdict.reason,
               "); allow it explicitly");
  return GdsFile(std::unique_ptr<State>(
      new State{path, std::move(context), std::move(lease), std::move(verdict)}));
}

GdsFile::GdsFile(std::unique_ptr<State> state) : _state(std::move(state)) {}
GdsFile::GdsFile(GdsFile&&) noexcept = default;
GdsFile& GdsFile::operator=(GdsFile&&) noexcept = default;
GdsFile::~GdsFile() = default;

void GdsFile::read(std::uint64_t file_offset, void* device_address, std::uint64_t size) const {
  _state->context->make_current();
  detail::cufile_read(_state->lease, _state->path, file_offset,
                      reinterpret_cast<std::uintptr_t>(device_address), size, 0, kPieceBytes);
}

void GdsFile::write(std::uint64_t file_offset, const void* device_address,
                    std::uint64_t size) const {
  _state->context->make_current();
  detail::cufile_write(_state->lease, _state->path, file_offset,
                       reinterpret_cast<std::uintptr_t>(device_address), size, kPieceBytes);
}

IoPath GdsFile::io_path() const noexcept {
  return _state->verdict.mode == detail::CuFileMode::Gds ? IoPath::CufileGds : IoPath::CufileCompat;
}

const std::string& GdsFile::reason() const noexcept { return _state->verdict.reason; }

}  // namespace ferry
