#include "ferry/tensor_reader.hpp"

#include <cerrno>

#include "ferry/error.hpp"
#include "io/file_descriptor.hpp"

namespace ferry {

struct TensorReader::Files {
  std::vector<detail::FileDescriptor> fds;  // one per Checkpoint::files() entry
};

TensorReader::TensorReader(std::shared_ptr<const Checkpoint> checkpoint)
    : _checkpoint(std::move(checkpoint)), _files(std::make_unique<Files>()) {
  FERRY_EXPECT(_checkpoint != nullptr, std::invalid_argument, "TensorReader needs a checkpoint");
  for (const auto& file : _checkpoint->files()) {
    auto fd = detail::open_for_reading(file.path);
    const std::uint64_t size = detail::file_size(fd, file.path);
    FERRY_FORMAT_EXPECT(size == file.size, file.path.string(), ": file is ", size,
                        " bytes now but was ", file.size, " when its header was read");
    _files->fds.push_back(std::move(fd));
  }
}

TensorReader::TensorReader(TensorReader&&) noexcept = default;
TensorReader& TensorReader::operator=(TensorReader&&) noexcept = default;
TensorReader::~TensorReader() = default;

void TensorReader::read(const TensorInfo& tensor, std::uint64_t begin, std::uint64_t length,
                        void* host) const {
  FERRY_EXPECT(begin <= tensor.size && length <= tensor.size - begin, std::out_of_range,
               "tensor \"", tensor.name, "\": bytes [", begin, ", ", begin + length,
               ") are outside its ", tensor.size, " bytes");
  FERRY_EXPECT(tensor.file_index < _files->fds.size(), std::out_of_range, "tensor \"", tensor.name,
               "\" names file ", tensor.file_index, " of ", _files->fds.size());
  if (length == 0) return;
  const auto& path = _checkpoint->files()[tensor.file_index].path;
  const auto& fd = _files->fds[tensor.file_index];
  // read_up_to stops only at the end of the file: a short count means it was truncated.
  const std::size_t got = detail::read_up_to(fd, host, length, tensor.offset + begin, path);
  FERRY_FORMAT_EXPECT(got == length, path.string(), ": tensor \"", tensor.name,
                      "\": the file ends inside its data (truncated after it was opened)");
}

}  // namespace ferry
