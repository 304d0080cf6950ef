// What platform/file_descriptor.hpp does the same way on every system, over the reads that
// platform/<os>/file_descriptor.cpp implements.
#include "platform/file_descriptor.hpp"

#include "ferry/error.hpp"

namespace ferry::detail {

void read_exact(const FileDescriptor& fd, void* buffer, std::size_t size, std::uint64_t offset,
                const std::filesystem::path& path) {
  std::size_t got = read_up_to(fd, buffer, size, offset, path);
  FERRY_FORMAT_EXPECT(got == size, path.string(), ": unexpected end of file at offset ",
                      offset + got, " (wanted ", size, " bytes at offset ", offset, ")");
}

}  // namespace ferry::detail
