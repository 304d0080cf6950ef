// kv_bench_probes.hpp: the figures `ferry kv bench` measures beside the store.
#include "kv_bench_probes.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>

#include "cuda/cuda_resources.hpp"
#include "cuda/gpu_checksum.hpp"
#include "ferry/error.hpp"
#include "kv/checksum.hpp"
#include "kv_bench_raw.hpp"
#include "platform/file_ops.hpp"
#include "platform/file_ranges.hpp"

namespace ferry::kv_bench {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::pair<double, double> pinned_copies(int ordinal, std::uint64_t bytes) {
  bytes = std::max<std::uint64_t>(bytes, 256ull << 20);  // large enough to show the link
  auto context = std::make_shared<detail::PrimaryContext>(ordinal);
  auto device = detail::allocate_device_memory(context, bytes);
  detail::HostBuffer pinned(bytes, context.get());
  std::memset(pinned.data(), 1, bytes);
  detail::Stream stream;
  const auto dptr = reinterpret_cast<shim::cu::DevicePtr>(device.get());
  const auto time = [&](bool to_device) {
    std::vector<double> rates;
    for (int r = 0; r < 6; ++r) {
      const auto start = Clock::now();
      if (to_device)
        FERRY_CU(cuMemcpyHtoDAsync, dptr, pinned.data(), bytes, stream.get());
      else
        FERRY_CU(cuMemcpyDtoHAsync, pinned.data(), dptr, bytes, stream.get());
      stream.synchronize();
      if (r > 0) rates.push_back(double(bytes) / seconds_since(start) / 1e9);
    }
    std::sort(rates.begin(), rates.end());
    return rates[rates.size() / 2];
  };
  const double d2h = time(false);
  return {d2h, time(true)};
}

std::pair<double, std::string> gpu_checksum_rate(int ordinal, std::uint64_t block,
                                                 std::uint64_t batch) {
  if (std::string why = detail::gpu_checksum_unavailable(ordinal); !why.empty()) return {0, why};
  auto context = std::make_shared<detail::PrimaryContext>(ordinal);
  const std::uint64_t bytes = block * batch;
  auto device = detail::allocate_device_memory(context, bytes);
  std::vector<std::byte> host(bytes);
  for (std::uint64_t i = 0; i < bytes; ++i) host[i] = std::byte(i * 2654435761u >> 13);
  detail::Stream stream;
  const auto base = reinterpret_cast<shim::cu::DevicePtr>(device.get());
  FERRY_CU(cuMemcpyHtoDAsync, base, host.data(), bytes, stream.get());
  std::vector<detail::DeviceBytes> blocks;
  for (std::uint64_t b = 0; b < batch; ++b) blocks.push_back({base + b * block, block});
  const std::vector<std::uint64_t> digests = detail::gpu_checksums(ordinal, blocks, stream.get());
  for (std::uint64_t b = 0; b < batch; ++b)
    FERRY_EXPECT(digests[b] == detail::kv::checksum(host.data() + b * block, block),
                 std::runtime_error, "the GPU checksum of block ", b, " (", block,
                 " bytes) differs from the host's");
  std::vector<double> rates;
  for (int r = 0; r < 5; ++r) {
    const auto start = Clock::now();
    detail::gpu_checksums(ordinal, blocks, stream.get());
    rates.push_back(double(bytes) / seconds_since(start) / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return {rates[rates.size() / 2], ""};
}

double resident_share(const std::vector<fs::path>& files) {
  constexpr std::uint64_t kWindow = 64ull << 20;
  std::uint64_t total = 0, resident = 0;
  for (const auto& file : files) {
    const detail::FileDescriptor fd = detail::open_existing(file, false);
    if (!fd) continue;
    const std::uint64_t size = fs::file_size(file);
    for (std::uint64_t at = 0; at < size; at += kWindow) {
      const std::uint64_t n = std::min(kWindow, size - at);
      total += n;
      if (detail::range_resident(fd.get(), at, n)) resident += n;
    }
  }
  return total ? double(resident) / double(total) : 0;
}

}  // namespace ferry::kv_bench
