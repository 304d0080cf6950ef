#include "backends/cufile/transfer_result.hpp"

#include <cerrno>

#include "ferry/error.hpp"
#include "shim/cufile.hpp"

namespace ferry::detail {

void check_cufile_transfer(ssize_t done, std::uint64_t wanted, const std::filesystem::path& path,
                           const char* what, std::uint64_t offset, bool writing) {
  if (done == -1) {
    const int error = errno;
    detail::fail_errno(error, path.string(), ": ", what, " of ", wanted, " bytes at offset ",
                       offset, " failed");
  }
  if (done < 0)
    detail::fail<CudaError>(path.string(), ": ", what, " of ", wanted, " bytes at offset ",
                            offset, " failed: ",
                            shim::cufile_error_text({static_cast<int>(-done), shim::cu::kSuccess}));
  if (writing && static_cast<std::uint64_t>(done) != wanted)
    detail::fail_errno(ENOSPC, path.string(), ": ", what, " wrote ", done, " of ", wanted,
                       " bytes at offset ", offset);
  FERRY_FORMAT_EXPECT(static_cast<std::uint64_t>(done) == wanted, path.string(),
                      ": unexpected end of file at offset ", offset + done);
}

}  // namespace ferry::detail
