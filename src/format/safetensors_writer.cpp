#include "ferry/safetensors_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "ferry/error.hpp"
#include "io/file_descriptor.hpp"

namespace ferry {
namespace {

void write_all(int fd, const void* data, std::size_t size, const std::filesystem::path& path) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      FERRY_SYSCALL_FAIL(path.string(), ": write failed");
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

}  // namespace

std::vector<TensorInfo> write_safetensors(
    const std::filesystem::path& path, std::span<const TensorSpec> tensors,
    const std::function<void(const TensorSpec&, std::span<std::byte>)>& fill,
    const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<TensorInfo> layout;
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    const auto bytes = tensor_byte_size(t.dtype, t.shape);
    FERRY_EXPECT(bytes.has_value(), std::invalid_argument, path.string(), ": tensor \"", t.name,
                 "\" has no whole-byte size in 64 bits");
    const std::uint64_t size = *bytes;
    header[t.name] = {{"dtype", dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + size}}};
    layout.push_back({t.name, t.dtype, t.shape, 0, offset, size});
    offset += size;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::uint64_t data_start = 8 + text.size();
  for (auto& info : layout) info.offset += data_start;

  detail::FileDescriptor fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) FERRY_SYSCALL_FAIL(path.string(), ": cannot create");
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(text.size() >> (8 * i));
  write_all(fd.get(), length, 8, path);
  write_all(fd.get(), text.data(), text.size(), path);
  std::vector<std::byte> buffer;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    buffer.resize(layout[i].size);
    fill(tensors[i], buffer);
    write_all(fd.get(), buffer.data(), buffer.size(), path);
  }
  return layout;
}

}  // namespace ferry
