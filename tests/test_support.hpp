// Helpers shared by the unit tests: temporary directories, raw files, random checkpoints and
// the plain host reference reader every fast path is compared with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "ferry/checkpoint.hpp"
#include "ferry/safetensors_writer.hpp"

namespace ferry::test {

class TempDir {
 public:
  TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir();
  const std::filesystem::path& path() const { return _path; }
  std::filesystem::path operator/(const std::string& name) const { return _path / name; }

 private:
  std::filesystem::path _path;
};

void write_file(const std::filesystem::path& path, const std::string& bytes);

// A safetensors file from a JSON header text and a data section, with no validation: for
// hand-made malformed files.
std::string raw_safetensors(const std::string& header_json, const std::string& data);

// Deterministic pseudo-random bytes.
std::vector<std::byte> random_bytes(std::size_t size, std::uint64_t seed);

// Writes `specs` with ferry's writer, filling each tensor with random bytes; returns the bytes
// written per tensor name.
std::map<std::string, std::vector<std::byte>> write_random_checkpoint(
    const std::filesystem::path& path, const std::vector<TensorSpec>& specs, std::uint64_t seed);

// Copies `size` bytes of cuda:0 memory at `device_data` to the host (GPU tests only).
std::vector<std::byte> read_device(const void* device_data, std::uint64_t size);

// The plain host path: one pread of exactly the tensor's bytes.
std::vector<std::byte> read_plain(const Checkpoint& checkpoint, const TensorInfo& tensor);

}  // namespace ferry::test
