#include "ferry/tensor_digest.hpp"

#include <xxhash.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "cuda/cuda_resources.hpp"
#include "ferry/error.hpp"

namespace ferry {
namespace {

// GPU tensors are read back in pieces so that hashing needs little host memory.
constexpr std::uint64_t kReadbackBytes = 64ull << 20;

struct StateDeleter {
  void operator()(XXH3_state_t* s) const noexcept { XXH3_freeState(s); }
};

}  // namespace

std::uint64_t tensor_digest(const LoadedCheckpoint& loaded, const LoadedTensor& tensor) {
  return memory_digest(loaded.device(), tensor.data, tensor.info->size);
}

std::uint64_t memory_digest(const Device& device, const void* data, std::uint64_t size) {
  if (!device.is_cuda()) return bytes_digest({static_cast<const std::byte*>(data), size});

  std::unique_ptr<XXH3_state_t, StateDeleter> state(XXH3_createState());
  if (state == nullptr || XXH3_64bits_reset(state.get()) != XXH_OK) throw std::bad_alloc();
  detail::PrimaryContext context(device.index);
  context.make_current();
  std::vector<std::byte> piece(std::min(size, kReadbackBytes));
  const auto base = reinterpret_cast<shim::cu::DevicePtr>(data);
  for (std::uint64_t done = 0; done < size; done += piece.size()) {
    const std::uint64_t n = std::min<std::uint64_t>(piece.size(), size - done);
    FERRY_CU(cuMemcpyDtoH, piece.data(), base + done, n);
    XXH3_64bits_update(state.get(), piece.data(), n);
  }
  return XXH3_64bits_digest(state.get());
}

std::uint64_t bytes_digest(std::span<const std::byte> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

std::string digest_hex(std::uint64_t digest) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(digest));
  return text;
}

}  // namespace ferry
