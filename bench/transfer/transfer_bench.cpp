// The transfer core's benchmark: latency of single small submissions (warm: the file in the
// page cache), and throughput of many 256 KiB and 4 MiB extents in both directions through
// O_DIRECT, beside raw O_DIRECT reads/writes of the same bytes and pinned copies measured in the
// same run; the file's pages are written back and dropped before every throughput pass. Prints
// a table and writes JSON.
//   transfer_bench --dir /mnt/nvme/bench --device cuda:0 --json out.json
//   transfer_bench --device cpu --scale 0.001   (a smoke run: tiny sizes)
//   --threads N (16), --rounds N (3: each throughput pass, ferry's and raw alternating)
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cuda_resources.hpp"
#include "ferry/error.hpp"
#include "ferry/transfer.hpp"

namespace {

using namespace ferry;
using Clock = std::chrono::steady_clock;

struct Args {
  std::filesystem::path dir = "/tmp/ferry-transfer-bench";
  Device device = Device::cpu();
  std::string json = "transfer_bench.json";
  double scale = 1.0;
  unsigned threads = 16;
  int latency_runs = 200;
  int rounds = 3;
};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<std::size_t>(p * v.size()))];
}

// Memory for `bytes` on the device (host memory for cpu).
struct Memory {
  std::shared_ptr<void> block;
  void* data() const { return block.get(); }
};

Memory allocate(const Device& d, std::uint64_t bytes) {
  if (!d.is_cuda()) {
    // Touched once here, so that no pass pays the first-touch page faults of its destination.
    Memory m{detail::allocate_host_memory(bytes)};
    std::memset(m.data(), 0, bytes);
    return m;
  }
  auto context = std::make_shared<detail::PrimaryContext>(d.index);
  return {detail::allocate_device_memory(context, bytes)};
}

std::shared_ptr<FileSet> data_file(const Args& a, std::uint64_t bytes) {
  std::filesystem::create_directories(a.dir);
  const auto path = a.dir / "data.bin";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    std::vector<char> block(1 << 20);
    for (std::size_t i = 0; i < block.size(); ++i) block[i] = static_cast<char>(i * 131);
    for (std::uint64_t at = 0; at < bytes; at += block.size())
      out.write(block.data(), static_cast<std::streamsize>(std::min<std::uint64_t>(block.size(), bytes - at)));
  }
  auto set = FileSet::create();
  set->add(path, FileAccess::ReadWrite);
  return set;
}

// Writes back dirty pages and drops the file's pages from the page cache, so that every pass
// (ferry's and the raw one) starts from the device and never pays another pass's write-back.
void drop_cached(const std::filesystem::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

double run_batch(const std::shared_ptr<FileSet>& set, Direction dir, const Device& d, void* memory,
                 std::uint64_t extent, std::uint64_t count, unsigned threads) {
  std::vector<Extent> extents;
  for (std::uint64_t i = 0; i < count; ++i)
    extents.push_back({0, i * extent, {{d, static_cast<std::byte*>(memory) + i * extent, extent}}});
  TransferOptions o;
  o.threads = threads;
  o.io = IoMode::Direct;  // beside raw O_DIRECT: the pipeline's cost, not the page cache's
  drop_cached(set->path(0));
  const auto start = Clock::now();
  Ticket t = submit(set, dir, std::move(extents), o);
  t.wait();
  t.rethrow_if_failed();
  return static_cast<double>(extent * count) / seconds_since(start) / 1e9;
}

// Raw O_DIRECT of the same bytes: `threads` threads, one pread/pwrite per extent.
double raw_direct(const std::filesystem::path& file, bool write, std::uint64_t extent,
                  std::uint64_t count, unsigned threads) {
  drop_cached(file);
  const int fd = ::open(file.c_str(), (write ? O_RDWR : O_RDONLY) | O_DIRECT);
  if (fd < 0) return 0;  // the file system refuses O_DIRECT
  std::atomic<std::uint64_t> next{0};
  std::atomic<bool> failed{false};
  const auto start = Clock::now();
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      void* buffer = nullptr;
      if (::posix_memalign(&buffer, 4096, extent) != 0) return;
      std::memset(buffer, 1, extent);
      for (std::uint64_t i; (i = next++) < count;) {
        const auto at = static_cast<off_t>(i * extent);
        const ssize_t n = write ? ::pwrite(fd, buffer, extent, at) : ::pread(fd, buffer, extent, at);
        if (n != static_cast<ssize_t>(extent)) failed = true;
      }
      std::free(buffer);
    });
  for (auto& t : pool) t.join();
  const double rate = static_cast<double>(extent * count) / seconds_since(start) / 1e9;
  ::close(fd);
  return failed ? 0 : rate;
}

// Pinned host <-> device copies of `bytes` (GPU only).
std::pair<double, double> pinned_copies(const Device& d, std::uint64_t bytes) {
  if (!d.is_cuda()) return {0, 0};
  auto context = std::make_shared<detail::PrimaryContext>(d.index);
  auto device = detail::allocate_device_memory(context, bytes);
  detail::HostBuffer host(bytes, context.get());
  detail::Stream stream;
  const auto ptr = reinterpret_cast<shim::cu::DevicePtr>(device.get());
  auto time = [&](bool up) {
    std::vector<double> rates;
    for (int r = 0; r < 4; ++r) {
      const auto start = Clock::now();
      if (up)
        FERRY_CU(cuMemcpyHtoDAsync, ptr, host.data(), bytes, stream.get());
      else
        FERRY_CU(cuMemcpyDtoHAsync, host.data(), ptr, bytes, stream.get());
      stream.synchronize();
      if (r) rates.push_back(static_cast<double>(bytes) / seconds_since(start) / 1e9);
    }
    return percentile(rates, 0.5);
  };
  return {time(true), time(false)};
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir") a.dir = v;
    else if (k == "--device") a.device = Device::parse(v);
    else if (k == "--json") a.json = v;
    else if (k == "--scale") a.scale = std::stod(v);
    else if (k == "--threads") a.threads = static_cast<unsigned>(std::stoul(v));
    else if (k == "--latency-runs") a.latency_runs = std::stoi(v);
    else if (k == "--rounds") a.rounds = std::max(1, std::stoi(v));
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  try {
    nlohmann::json out = {{"device", a.device.to_string()}, {"dir", a.dir.string()}};
    const auto count = [&](std::uint64_t n) { return std::max<std::uint64_t>(2, static_cast<std::uint64_t>(static_cast<double>(n) * a.scale)); };
    const std::uint64_t small_n = count(10000), large_n = count(2000);
    const std::uint64_t bytes = std::max<std::uint64_t>(small_n * (256 << 10), large_n * (4ull << 20));
    auto set = data_file(a, bytes);
    Memory memory = allocate(a.device, bytes);
    std::printf("%-44s %12s\n", "measure", "value");
    for (std::uint64_t size : {std::uint64_t{4096}, std::uint64_t{1 << 20}}) {
      std::vector<double> lat;
      for (int r = 0; r < a.latency_runs + 10; ++r) {
        const auto start = Clock::now();
        Ticket t = submit(set, Direction::FileToMemory, {{0, 0, {{a.device, memory.data(), size}}}}, {});
        t.wait();
        t.rethrow_if_failed();
        if (r >= 10) lat.push_back(seconds_since(start) * 1e6);  // warm only
      }
      const std::string name = "latency_" + std::to_string(size >> 10) + "KiB_us";
      out[name] = {{"p50", percentile(lat, 0.5)}, {"p99", percentile(lat, 0.99)}};
      std::printf("%-44s %6.1f / %6.1f\n", (name + " p50/p99").c_str(), percentile(lat, 0.5),
                  percentile(lat, 0.99));
    }
    // Each pass a.rounds times, ferry's and raw alternating (which goes first swaps every
    // round), the median kept: drift of the device (write caches, burst credits) hits both.
    std::printf("raw: %u threads, one O_DIRECT pread/pwrite of one extent each (queue depth %u);\n"
                "ferry: %u workers, O_DIRECT, extents back to back in the file grouped up to 4 MiB\n"
                "per read or write; median of %d alternating rounds\n",
                a.threads, a.threads, a.threads, a.rounds);
    out["raw"] = std::to_string(a.threads) + " threads, one O_DIRECT pread/pwrite per extent";
    out["rounds"] = a.rounds;
    for (auto [extent, n] : {std::pair<std::uint64_t, std::uint64_t>{256 << 10, small_n},
                             std::pair<std::uint64_t, std::uint64_t>{4ull << 20, large_n}}) {
      const std::string tag = std::to_string(n) + "x" + std::to_string(extent >> 10) + "KiB";
      std::vector<double> read, write, raw_read, raw_write;
      const auto ferry_passes = [&] {
        read.push_back(run_batch(set, Direction::FileToMemory, a.device, memory.data(), extent, n,
                                 a.threads));
        write.push_back(run_batch(set, Direction::MemoryToFile, a.device, memory.data(), extent,
                                  n, a.threads));
      };
      const auto raw_passes = [&] {
        raw_read.push_back(raw_direct(set->path(0), false, extent, n, a.threads));
        raw_write.push_back(raw_direct(set->path(0), true, extent, n, a.threads));
      };
      for (int r = 0; r < a.rounds; ++r) {
        if (r % 2) {
          raw_passes();
          ferry_passes();
        } else {
          ferry_passes();
          raw_passes();
        }
      }
      const double median[] = {percentile(read, 0.5), percentile(write, 0.5),
                               percentile(raw_read, 0.5), percentile(raw_write, 0.5)};
      out[tag] = {{"file_to_memory_gbps", median[0]}, {"memory_to_file_gbps", median[1]},
                  {"raw_odirect_read_gbps", median[2]}, {"raw_odirect_write_gbps", median[3]},
                  {"rounds", {{"file_to_memory", read}, {"memory_to_file", write},
                              {"raw_read", raw_read}, {"raw_write", raw_write}}}};
      std::printf("%-44s %12.2f\n", (tag + " file->memory GB/s").c_str(), median[0]);
      std::printf("%-44s %12.2f\n", (tag + " memory->file GB/s").c_str(), median[1]);
      std::printf("%-44s %12.2f\n", (tag + " raw O_DIRECT read GB/s").c_str(), median[2]);
      std::printf("%-44s %12.2f\n", (tag + " raw O_DIRECT write GB/s").c_str(), median[3]);
    }
    const auto [h2d, d2h] = pinned_copies(a.device, std::min<std::uint64_t>(bytes, 1ull << 30));
    out["pinned_h2d_gbps"] = h2d;
    out["pinned_d2h_gbps"] = d2h;
    std::printf("%-44s %12.2f\n%-44s %12.2f\n", "pinned H2D GB/s", h2d, "pinned D2H GB/s", d2h);
    std::ofstream(a.json) << out.dump(2) << "\n";
    std::filesystem::remove(set->path(0));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "transfer_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
