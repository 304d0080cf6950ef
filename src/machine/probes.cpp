// The measurements `ferry doctor` takes: copy bandwidth, O_DIRECT, read throughput.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "cuda/cuda_resources.hpp"
#include "ferry/error.hpp"
#include "ferry/machine.hpp"
#include "io/source_file.hpp"
#include "shim/cuda_driver.hpp"

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

double time_copies(const detail::Stream& stream, shim::cu::DevicePtr dst, const void* src,
                   std::uint64_t bytes, int repeats) {
  std::vector<double> rates;
  for (int r = 0; r < repeats + 1; ++r) {
    const auto start = Clock::now();
    FERRY_CU(cuMemcpyHtoDAsync, dst, src, bytes, stream.get());
    stream.synchronize();
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    if (r > 0) rates.push_back(static_cast<double>(bytes) / s / 1e9);  // the first warms up
  }
  return median(rates);
}

}  // namespace

CopyBandwidth measure_host_to_device(int device, std::uint64_t bytes, int repeats) {
  auto context = std::make_shared<detail::PrimaryContext>(device);
  auto target = detail::allocate_device_memory(context, bytes);
  const auto dst = reinterpret_cast<shim::cu::DevicePtr>(target.get());
  detail::Stream stream;
  CopyBandwidth result;
  {
    detail::HostBuffer pinned(bytes, context.get());
    std::memset(pinned.data(), 1, bytes);
    result.pinned_gbps = time_copies(stream, dst, pinned.data(), bytes, repeats);
  }
  std::vector<std::byte> pageable(bytes, std::byte{1});
  result.pageable_gbps = time_copies(stream, dst, pageable.data(), bytes, repeats);
  return result;
}

DirectProbe probe_direct(const std::filesystem::path& file) {
#ifdef _WIN32
  const std::string flag = "FILE_FLAG_NO_BUFFERING";
#else
  const std::string flag = "O_DIRECT";
#endif
  detail::FileDescriptor fd = detail::try_open_direct(file);
  if (!fd) return {false, "open with " + flag + " refused: " + std::strerror(errno), flag};
  detail::HostBuffer buffer(detail::kDirectAlignment, nullptr);
  try {
    detail::read_up_to(fd, buffer.data(), detail::kDirectAlignment, 0, file);
  } catch (const std::exception& e) {
    return {false, "aligned " + flag + " read failed: " + e.what(), flag};
  }
  return {true, "aligned " + flag + " reads work", flag};
}

double measure_read(const std::vector<std::filesystem::path>& files, IoMode mode, unsigned threads,
                    std::uint64_t max_bytes) {
  constexpr std::uint64_t kRead = 8ull << 20;
  struct Piece {
    std::size_t file;
    std::uint64_t offset, size;
  };
  std::vector<std::unique_ptr<detail::SourceFile>> sources;
  std::vector<Piece> pieces;
  std::uint64_t planned = 0;
  for (std::size_t f = 0; f < files.size() && planned < max_bytes; ++f) {
    sources.push_back(std::make_unique<detail::SourceFile>(files[f], mode));
    const std::uint64_t size = std::filesystem::file_size(files[f]);
    for (std::uint64_t o = 0; o < size && planned < max_bytes; o += kRead) {
      pieces.push_back({f, o, std::min(kRead, size - o)});
      planned += pieces.back().size;
    }
  }
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  const auto start = Clock::now();
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t)
    workers.emplace_back([&] {
      detail::HostBuffer buffer(kRead + 2 * detail::kDirectAlignment, nullptr);
      try {
        for (std::size_t i; !failed && (i = next++) < pieces.size();)
          sources[pieces[i].file]->read(pieces[i].offset, pieces[i].size, buffer.data());
      } catch (...) {
        failed = true;
      }
    });
  for (auto& w : workers) w.join();
  FERRY_EXPECT(!failed, std::runtime_error, "read measurement failed");
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
  return s > 0 ? static_cast<double>(planned) / s / 1e9 : 0.0;
}

}  // namespace ferry
