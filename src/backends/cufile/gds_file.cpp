// GdsFile: a face over the transfer core's cuFile backend for one file. Each read or write is a
// one-extent submission (Backend::Cufile), so the file is opened once in a file set and its
// cuFile handle comes from the backend's cache, keyed by the file's identity.
#include "backends/cufile/gds_file.hpp"

#include "cuda/cuda_resources.hpp"
#include "backends/cufile/cufile_files.hpp"
#include "shim/gds_mode.hpp"
#include "ferry/error.hpp"
#include "platform/system.hpp"
#include "ferry/transfer.hpp"

namespace ferry {

struct GdsFile::State {
  std::shared_ptr<FileSet> files;
  Device device;
  bool allow_compat = false;
  detail::HandleCache::Lease registered;  // held: registered at open, as long as the object
  detail::CuFileVerdict verdict;
};

GdsFile GdsFile::open(const std::filesystem::path& path, bool writable, int device,
                      bool allow_compat) {
  detail::device_context(device).make_current();
  const detail::CuFileFacts& facts = detail::probe_cufile();
  const detail::CuFileVerdict driver = detail::driver_verdict(facts);
  FERRY_EXPECT(driver.mode != detail::CuFileMode::Unavailable, CudaError, path.string(),
               ": cuFile cannot run: ", driver.reason);
  auto files = FileSet::create(1);
  files->add(path, writable ? FileAccess::ReadWrite : FileAccess::Read);
  auto registered = detail::cufile_handles().acquire(files->acquire(0, true));
  // The file system is known only once the file exists, so the verdict follows the open.
  detail::CuFileVerdict verdict =
      detail::file_verdict(facts, detail::filesystem_name(path.string()));
  FERRY_EXPECT(verdict.mode == detail::CuFileMode::Gds || allow_compat, std::invalid_argument,
               path.string(), ": cuFile would run in compatibility mode (", verdict.reason,
               "); allow it explicitly");
  return GdsFile(
      std::unique_ptr<State>(new State{std::move(files), Device::cuda(device), allow_compat,
                                       std::move(registered), std::move(verdict)}));
}

GdsFile::GdsFile(std::unique_ptr<State> state) : _state(std::move(state)) {}
GdsFile::GdsFile(GdsFile&&) noexcept = default;
GdsFile& GdsFile::operator=(GdsFile&&) noexcept = default;
GdsFile::~GdsFile() = default;

namespace {

void move_bytes(const std::shared_ptr<FileSet>& files, const Device& device, bool allow_compat,
                Direction direction, std::uint64_t file_offset, void* device_address,
                std::uint64_t size) {
  TransferOptions options;
  options.backend = Backend::Cufile;
  options.allow_compat = allow_compat;
  options.threads = 1;
  Ticket t =
      submit(files, direction, {{0, file_offset, {{device, device_address, size}}}}, options);
  t.wait();
  t.rethrow_if_failed();
}

}  // namespace

void GdsFile::read(std::uint64_t file_offset, void* device_address, std::uint64_t size) const {
  move_bytes(_state->files, _state->device, _state->allow_compat, Direction::FileToMemory,
             file_offset, device_address, size);
}

void GdsFile::write(std::uint64_t file_offset, const void* device_address,
                    std::uint64_t size) const {
  move_bytes(_state->files, _state->device, _state->allow_compat, Direction::MemoryToFile,
             file_offset, const_cast<void*>(device_address), size);
}

IoPath GdsFile::io_path() const noexcept {
  return _state->verdict.mode == detail::CuFileMode::Gds ? IoPath::CufileGds : IoPath::CufileCompat;
}

const std::string& GdsFile::reason() const noexcept { return _state->verdict.reason; }

}  // namespace ferry
