// What a cuFileRead or cuFileWrite returned, turned into ferry's error types.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>

namespace ferry::detail {

// cuFileRead/cuFileWrite return the bytes moved, -1 with errno set for an OS error, or a negated
// cuFile error code. Throws std::system_error for the first (errno read first), CudaError for
// the second, FormatError for a short read (the file ended) and std::system_error(ENOSPC) for a
// short write; returns for a complete transfer.
void check_cufile_transfer(ssize_t done, std::uint64_t wanted, const std::filesystem::path& path,
                           const char* what, std::uint64_t offset, bool writing);

}  // namespace ferry::detail
