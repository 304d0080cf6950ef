#include "test_support.hpp"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>

#include "cuda/cuda_resources.hpp"
#include "platform/file_descriptor.hpp"

namespace ferry::test {

TempDir::TempDir() {
  // mkdtemp's contract, portably: a fresh directory of a random name, created by us alone.
  const char* tmp = std::getenv("TMPDIR");
  const std::filesystem::path base =
      tmp ? std::filesystem::path(tmp) : std::filesystem::temp_directory_path();
  std::random_device seed;
  std::mt19937_64 random(seed());
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::filesystem::path candidate = base / ("ferry-test-" + std::to_string(random()));
    if (std::filesystem::create_directory(candidate)) {
      _path = candidate;
      return;
    }
  }
  throw std::runtime_error("cannot create a temporary directory in " + base.string());
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(_path, ignored);
}

void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

std::string raw_safetensors(const std::string& header_json, const std::string& data) {
  std::string out(8, '\0');
  const std::uint64_t n = header_json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header_json + data;
}

std::vector<std::byte> random_bytes(std::size_t size, std::uint64_t seed) {
  std::vector<std::byte> out(size);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x1234567;
  for (auto& b : out) {
    x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
    b = static_cast<std::byte>((x * 0x2545F4914F6CDD1Dull) >> 56);
  }
  return out;
}

std::map<std::string, std::vector<std::byte>> write_random_checkpoint(
    const std::filesystem::path& path, const std::vector<TensorSpec>& specs, std::uint64_t seed) {
  std::map<std::string, std::vector<std::byte>> written;
  write_safetensors(path, specs, [&](const TensorSpec& spec, std::span<std::byte> out) {
    auto bytes = random_bytes(out.size(), seed++);
    if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
    written[spec.name] = std::move(bytes);
  });
  return written;
}

std::vector<std::byte> read_device(const void* device_data, std::uint64_t size) {
  detail::PrimaryContext context(0);
  context.make_current();
  std::vector<std::byte> host(size);
  if (size)
    FERRY_CU(cuMemcpyDtoH, host.data(), reinterpret_cast<shim::cu::DevicePtr>(device_data), size);
  return host;
}

std::vector<std::byte> read_plain(const Checkpoint& checkpoint, const TensorInfo& tensor) {
  const auto& path = checkpoint.files()[tensor.file_index].path;
  auto fd = detail::open_for_reading(path);
  std::vector<std::byte> out(tensor.size);
  detail::read_exact(fd, out.data(), out.size(), tensor.offset, path);
  return out;
}

}  // namespace ferry::test
