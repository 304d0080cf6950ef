// The KV store on the CPU path: put (durable) and get GB/s per block size beside raw O_DIRECT
// writes and reads of the same bytes on the same root, lookup p50/p99 of a 1,000-key prefix
// among N indexed blocks, index bytes per block, and the index rebuild time of a reopen.
//   kv_bench ROOT [--sizes 256K,1M,4M,16M] [--bytes 1G] [--batch 8] [--index-blocks 1000000]
// Timing here is for reporting only; the smoke test checks that it runs, never its numbers.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "ferry/error.hpp"
#include "ferry/kv_store.hpp"
#include "kv/kv_format.hpp"
#include "kv/kv_index.hpp"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::uint64_t parse_size(const std::string& text) {
  char* end = nullptr;
  std::uint64_t n = std::strtoull(text.c_str(), &end, 10);
  if (*end == 'K' || *end == 'k') n <<= 10;
  if (*end == 'M' || *end == 'm') n <<= 20;
  if (*end == 'G' || *end == 'g') n <<= 30;
  return n;
}

struct Aligned {
  explicit Aligned(std::size_t n) : data(static_cast<std::byte*>(std::aligned_alloc(4096, n))) {
    if (!data) throw std::bad_alloc();
  }
  ~Aligned() { std::free(data); }
  std::byte* data;
};

// Raw O_DIRECT: one pwrite per block, fdatasync per batch (as the store syncs), then preads.
std::pair<double, double> raw_direct(const fs::path& file, std::uint64_t block, std::uint64_t count,
                                     std::uint64_t batch, std::byte* bytes) {
  int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
  bool direct = fd >= 0;
  if (!direct) fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) FERRY_SYSCALL_FAIL(file.string());
  const std::uint64_t slot = (block + 4095) / 4096 * 4096;
  if (::posix_fallocate(fd, 0, static_cast<off_t>(slot * count)) != 0)
    FERRY_SYSCALL_FAIL(file.string(), ": fallocate");
  auto start = Clock::now();
  for (std::uint64_t i = 0; i < count; ++i) {
    if (::pwrite(fd, bytes, slot, static_cast<off_t>(i * slot)) != static_cast<ssize_t>(slot))
      FERRY_SYSCALL_FAIL(file.string(), ": pwrite");
    if ((i + 1) % batch == 0 || i + 1 == count) ::fdatasync(fd);
  }
  const double write_s = seconds_since(start);
  start = Clock::now();
  for (std::uint64_t i = 0; i < count; ++i)
    if (::pread(fd, bytes, slot, static_cast<off_t>(i * slot)) != static_cast<ssize_t>(slot))
      FERRY_SYSCALL_FAIL(file.string(), ": pread");
  const double read_s = seconds_since(start);
  ::close(fd);
  fs::remove(file);
  return {write_s, read_s};
}

void bench_size(const fs::path& root, std::uint64_t block, std::uint64_t total,
                std::uint64_t batch) {
  const std::uint64_t count = std::max<std::uint64_t>(batch, total / block);
  const ferry::KVNamespace ns{"kv-bench", "bytes", "block=" + std::to_string(block), 0, 1};
  ferry::KVStoreOptions options;
  options.checkpoint_on_close = false;
  Aligned data(block + 4096);
  for (std::uint64_t i = 0; i < block; ++i) data.data[i] = static_cast<std::byte>(i * 131 + 7);
  double put_s = 0, get_s = 0;
  bool direct = false;
  {
    auto store = ferry::KVStore::open(root, ns, count * ((block + 4095) / 4096 * 4096), block,
                                      options);
    direct = store.stats().direct_io;
    std::vector<ferry::KVPiece> pieces(batch, ferry::KVPiece{data.data, block});
    std::vector<ferry::KVBlock> blocks;
    for (auto& p : pieces) blocks.emplace_back(&p, 1);
    std::vector<ferry::KVKey> keys(batch);
    auto start = Clock::now();
    for (std::uint64_t i = 0; i < count; i += batch) {
      const std::uint64_t n = std::min(batch, count - i);
      for (std::uint64_t k = 0; k < n; ++k) keys[k] = i + k + 1;
      for (const auto& r : store.put(std::span(keys).first(n), std::span(blocks).first(n)))
        FERRY_EXPECT(r.ok(), std::runtime_error, "kv_bench put: ", r.message);
    }
    put_s = seconds_since(start);
    start = Clock::now();
    for (std::uint64_t i = 0; i < count; i += batch) {
      const std::uint64_t n = std::min(batch, count - i);
      for (std::uint64_t k = 0; k < n; ++k) keys[k] = i + k + 1;
      for (const auto& r : store.get(std::span(keys).first(n), std::span(blocks).first(n)))
        FERRY_EXPECT(r.ok(), std::runtime_error, "kv_bench get: ", r.message);
    }
    get_s = seconds_since(start);
  }
  fs::remove_all(root / ferry::KVStore::directory_name(ns));
  const auto [raw_write_s, raw_read_s] = raw_direct(root / "kv-bench-raw.bin", block, count,
                                                    batch, data.data);
  const double gb = double(count) * double(block) / 1e9;
  std::printf(
      "block %8llu KiB x %6llu (batch %llu, %s): put %6.2f GB/s (raw O_DIRECT write %6.2f), "
      "get %6.2f GB/s (raw O_DIRECT read %6.2f)\n",
      static_cast<unsigned long long>(block >> 10), static_cast<unsigned long long>(count),
      static_cast<unsigned long long>(batch), direct ? "O_DIRECT" : "buffered", gb / put_s,
      gb / raw_write_s, gb / get_s, gb / raw_read_s);
}

// The index alone: what lookup and reopen cost with N blocks (no slab I/O involved).
void bench_index(const fs::path& root, std::uint64_t blocks) {
  using namespace ferry::detail::kv;
  std::mt19937_64 random(1);
  std::vector<std::uint64_t> keys(blocks);
  for (auto& k : keys) k = random();
  auto start = Clock::now();
  KvIndex index(static_cast<std::uint32_t>(blocks));
  std::optional<std::uint64_t> evicted;
  for (std::uint64_t k : keys) index.publish(index.take_slot(evicted), k, 4096, k);
  const double fill_s = seconds_since(start);
  std::vector<double> micros;
  std::size_t hits = 0;
  for (int rep = 0; rep < 1000; ++rep) {
    const std::size_t first = random() % (blocks - 1000);
    start = Clock::now();
    std::size_t n = 0;
    while (n < 1000 && index.find(keys[first + n]) != kNoSlot) ++n;
    micros.push_back(seconds_since(start) * 1e6);
    hits += n;
  }
  std::sort(micros.begin(), micros.end());
  // Reopen: the checkpoint of these blocks decoded and the index rebuilt, as open does.
  IndexSnapshot snapshot;
  for (std::uint32_t s : index.lru_order()) {
    const SlotEntry& e = index.slot(s);
    snapshot.entries.push_back({RecordKind::put, 0, e.key, s, e.length, e.checksum});
  }
  const Limits limits{blocks, 4096};
  const auto bytes = encode_checkpoint(snapshot, limits);
  start = Clock::now();
  const CheckpointHeader header = decode_checkpoint_header(bytes, limits, "bench");
  KvIndex rebuilt(static_cast<std::uint32_t>(blocks));
  for (std::uint64_t i = 0; i < header.count; ++i) {
    const Record r = decode_checkpoint_entry(bytes, i, limits, "bench");
    if (!rebuilt.insert_new(r.slot, r.key, static_cast<std::uint32_t>(r.length), r.checksum))
      throw std::runtime_error("kv_bench: the checkpoint repeats a slot or key");
  }
  const double reopen_s = seconds_since(start);
  std::printf(
      "index of %llu blocks: %.1f bytes per block; lookup of a 1,000-key prefix p50 %.1f us, "
      "p99 %.1f us (%zu hits); built in %.2f s; reopen from a %.0f MB checkpoint %.2f s\n",
      static_cast<unsigned long long>(blocks), double(index.memory_bytes()) / double(blocks),
      micros[micros.size() / 2], micros[micros.size() * 99 / 100], hits, fill_s,
      double(bytes.size()) / 1e6, reopen_s);
  (void)root;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: kv_bench ROOT [--sizes 256K,1M,4M,16M] [--bytes 1G] [--batch 8] "
                 "[--index-blocks 1000000]\n");
    return 2;
  }
  const fs::path root = argv[1];
  std::string sizes = "256K,1M,4M,16M";
  std::uint64_t total = 1ull << 30, batch = 8, index_blocks = 1000000;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--sizes") sizes = value;
    else if (flag == "--bytes") total = parse_size(value);
    else if (flag == "--batch") batch = std::max<std::uint64_t>(1, parse_size(value));
    else if (flag == "--index-blocks") index_blocks = std::max<std::uint64_t>(2000, parse_size(value));
    else {
      std::fprintf(stderr, "kv_bench: unknown option %s\n", flag.c_str());
      return 2;
    }
  }
  try {
    fs::create_directories(root);
    for (std::size_t at = 0; at <= sizes.size();) {
      const std::size_t comma = std::min(sizes.find(',', at), sizes.size());
      bench_size(root, parse_size(sizes.substr(at, comma - at)), total, batch);
      at = comma + 1;
    }
    bench_index(root, index_blocks);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kv_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
