// What a warm staged load can reach on this machine: the staged path with the file taken away.
// N threads each copy `chunk` bytes at a time (memcpy) from a pageable source already in memory
// (as the page cache is) into their own pinned slots, and queue each slot's copy to the device
// on their own stream, waiting for a slot's last copy before refilling it: the same bytes cross
// host memory as in a load (the CPU reads and writes each one, the copy engine reads it again),
// so the host's memory bandwidth bounds both alike. Printed beside pinned host -> device copy
// alone and pinned host -> device copy while the threads copy host memory (memcpy into their
// pinned slots, nothing sent) at --copy-gbps in all (a load's own rate), measured in the same
// run; the median of the runs.
//   staged_bound --device cuda:0 [--bytes 1.19e9] [--threads 16] [--chunk-mib 4] [--slots 2]
//                [--copy-gbps 44] [--runs 5] [--json out.json]
//   staged_bound --device cpu --bytes 1e7 --runs 1   (a smoke run: memcpy stands in for copies)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cuda/cuda_resources.hpp"
#include "ferry/device.hpp"
#include "ferry/error.hpp"
#include "services/copier.hpp"

namespace {

using namespace ferry;
using Clock = std::chrono::steady_clock;

struct Args {
  Device device = Device::cpu();
  std::uint64_t bytes = 1192099840;  // the Qwen3-0.6B shape's tensor bytes
  unsigned threads = 16;
  std::uint64_t chunk = 4ull << 20;
  unsigned slots = 2;
  int runs = 5;
  double copy_gbps = 0;  // host copying beside the pinned copy; 0: the staged bound's rate
  std::string json;
};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// GB/s of one pass: every thread takes the next chunk, memcpy into its slot, queues the copy out.
double staged_pass(const Args& a, const std::byte* source, std::uintptr_t destination,
                   const detail::PrimaryContext* pin) {
  std::vector<std::unique_ptr<detail::HostBuffer>> slabs;
  for (unsigned t = 0; t < a.threads; ++t)
    slabs.push_back(std::make_unique<detail::HostBuffer>(a.slots * a.chunk, pin));
  std::atomic<std::uint64_t> next{0};
  std::atomic<bool> failed{false};
  const auto start = Clock::now();
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < a.threads; ++t)
    pool.emplace_back([&, t] {
      try {
        auto copier = detail::make_copier(a.device, a.slots);
        for (std::uint64_t k = 0;; ++k) {
          const std::uint64_t at = next.fetch_add(a.chunk);
          if (at >= a.bytes) break;
          const std::uint64_t n = std::min(a.chunk, a.bytes - at);
          const auto s = static_cast<unsigned>(k % a.slots);
          std::byte* slot = slabs[t]->data() + s * a.chunk;
          copier->wait(s);
          std::memcpy(slot, source + at, n);
          copier->put(destination + at, slot, n);
          copier->fence(s);
        }
        copier->drain();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "thread %u: %s\n", t, e.what());
        failed = true;
      }
    });
  for (auto& t : pool) t.join();
  const double rate = static_cast<double>(a.bytes) / seconds_since(start) / 1e9;
  return failed ? 0 : rate;
}

// Pinned host -> device copy of the same bytes in one call (GPU only).
double pinned_copy(const Args& a, std::uintptr_t destination, const detail::PrimaryContext& pin) {
  detail::HostBuffer host(a.bytes, &pin);
  std::memset(host.data(), 1, a.bytes);
  detail::Stream stream;
  std::vector<double> rates;
  for (int r = 0; r <= a.runs; ++r) {
    const auto start = Clock::now();
    FERRY_CU(cuMemcpyHtoDAsync, destination, host.data(), a.bytes, stream.get());
    stream.synchronize();
    if (r) rates.push_back(static_cast<double>(a.bytes) / seconds_since(start) / 1e9);
  }
  return median(rates);
}

// Pinned host -> device GB/s of `a.bytes` while `a.threads` threads memcpy from the source into
// pinned slots of their own at `gbps` in all (paced; nothing is sent), and the rate they reached.
std::pair<double, double> pinned_copy_beside_host_copies(const Args& a, const std::byte* source,
                                                         std::uintptr_t destination,
                                                         const detail::PrimaryContext& pin,
                                                         double gbps) {
  detail::HostBuffer host(a.bytes, &pin);
  std::memset(host.data(), 1, a.bytes);
  std::vector<std::unique_ptr<detail::HostBuffer>> slabs;
  for (unsigned t = 0; t < a.threads; ++t)
    slabs.push_back(std::make_unique<detail::HostBuffer>(a.slots * a.chunk, &pin));
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> copied{0};
  const double per_thread = gbps * 1e9 / a.threads;  // bytes per second
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < a.threads; ++t)
    pool.emplace_back([&, t] {
      const auto start = Clock::now();
      std::uint64_t mine = 0;
      for (std::uint64_t k = 0; !stop.load(std::memory_order_relaxed); ++k) {
        const std::uint64_t at = (k * a.threads + t) * a.chunk % (a.bytes - a.chunk + 1);
        std::memcpy(slabs[t]->data() + (k % a.slots) * a.chunk, source + at, a.chunk);
        mine += a.chunk;
        copied.fetch_add(a.chunk, std::memory_order_relaxed);
        std::this_thread::sleep_until(
            start + std::chrono::duration_cast<Clock::duration>(
                        std::chrono::duration<double>(static_cast<double>(mine) / per_thread)));
      }
    });
  detail::Stream stream;
  std::vector<double> rates;
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the copying under way
  const auto host_start = Clock::now();
  const std::uint64_t host_before = copied.load();
  for (int r = 0; r <= a.runs; ++r) {
    const auto start = Clock::now();
    FERRY_CU(cuMemcpyHtoDAsync, destination, host.data(), a.bytes, stream.get());
    stream.synchronize();
    if (r) rates.push_back(static_cast<double>(a.bytes) / seconds_since(start) / 1e9);
  }
  const double host_rate =
      static_cast<double>(copied.load() - host_before) / seconds_since(host_start) / 1e9;
  stop = true;
  for (auto& t : pool) t.join();
  return {median(rates), host_rate};
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--device")
      a.device = Device::parse(v);
    else if (k == "--bytes")
      a.bytes = static_cast<std::uint64_t>(std::stod(v));
    else if (k == "--threads")
      a.threads = std::max(1u, static_cast<unsigned>(std::stoul(v)));
    else if (k == "--chunk-mib")
      a.chunk = static_cast<std::uint64_t>(std::stod(v) * (1 << 20));
    else if (k == "--slots")
      a.slots = std::max(1u, static_cast<unsigned>(std::stoul(v)));
    else if (k == "--runs")
      a.runs = std::max(1, std::stoi(v));
    else if (k == "--copy-gbps")
      a.copy_gbps = std::stod(v);
    else if (k == "--json")
      a.json = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  try {
    a.chunk = std::max<std::uint64_t>(a.chunk / 4096 * 4096, 4096);
    a.bytes = std::max(a.bytes, a.chunk);
    // The source as the page cache holds a file: pageable, touched, not pinned.
    std::vector<std::byte> source(a.bytes);
    for (std::uint64_t i = 0; i < a.bytes; i += 4096) source[i] = std::byte(i >> 12);
    std::shared_ptr<detail::PrimaryContext> context;
    std::shared_ptr<void> destination;
    if (a.device.is_cuda()) {
      context = std::make_shared<detail::PrimaryContext>(a.device.index);
      destination = detail::allocate_device_memory(context, a.bytes);
    } else {
      destination = detail::allocate_host_memory(a.bytes);
      std::memset(destination.get(), 0, a.bytes);
    }
    const auto to = reinterpret_cast<std::uintptr_t>(destination.get());
    const detail::PrimaryContext* pin = context ? &detail::device_context(a.device.index) : nullptr;
    staged_pass(a, source.data(), to, pin);  // warm-up: threads, streams, pinning
    std::vector<double> rates;
    for (int r = 0; r < a.runs; ++r) rates.push_back(staged_pass(a, source.data(), to, pin));
    const double staged = median(rates);
    const double pinned = context ? pinned_copy(a, to, *pin) : 0;
    std::printf(
        "staged bound (memcpy from memory -> pinned slots -> %s; %u threads x %.0f MiB x "
        "%u slots, median of %d): %.2f GB/s",
        a.device.to_string().c_str(), a.threads, static_cast<double>(a.chunk) / (1 << 20), a.slots,
        a.runs, staged);
    if (pinned > 0) std::printf("; pinned H2D alone %.2f GB/s (%.3f x)", pinned, staged / pinned);
    std::printf("\n");
    double beside = 0, host_rate = 0;
    if (context) {
      const double gbps = a.copy_gbps > 0 ? a.copy_gbps : staged;
      std::tie(beside, host_rate) =
          pinned_copy_beside_host_copies(a, source.data(), to, *pin, gbps);
      std::printf(
          "pinned H2D while %u threads copy host memory at %.1f GB/s (asked %.1f): %.2f GB/s "
          "(%.3f x alone)\n",
          a.threads, host_rate, gbps, beside, pinned > 0 ? beside / pinned : 0.0);
    }
    if (!a.json.empty()) {
      const nlohmann::json out = {{"device", a.device.to_string()},
                                  {"bytes", a.bytes},
                                  {"threads", a.threads},
                                  {"chunk_bytes", a.chunk},
                                  {"slots", a.slots},
                                  {"staged_gbps", staged},
                                  {"runs_gbps", rates},
                                  {"pinned_h2d_gbps", pinned},
                                  {"pinned_h2d_beside_copies_gbps", beside},
                                  {"host_copy_gbps", host_rate}};
      std::ofstream(a.json) << out.dump(1) << "\n";
    }
    return staged > 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "staged_bound: %s\n", e.what());
    return 1;
  }
}
