// The KV store's staged path (the one GPU blocks take) profiled on a machine without a GPU: host
// blocks sent through the transfer core's pinned-slot pipeline as GPU blocks are (the copies are
// memcpy instead of DMA), on one slab file. Per block size: put (durable), cold get and warm get
// GB/s and where the workers' time went (reads or writes, copy waits, checksums in staging, and
// waits to checksum a block's bytes in order), from the block I/O's own statistics.
//   kv_staged_profile ROOT [--sizes 1M,4M,16M] [--bytes 256M] [--batch 16 | --batch-bytes 64M]
//                          [--pieces 2] [--rounds 3] [--threads N (default: one per core, <= 16)]
// Blocks of 2 pieces or more go through staging (one piece of host memory is read straight into
// it). Every block got back is compared with what was put. Timing is for reporting only.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ferry/error.hpp"
#include "kv/slab_files.hpp"
#include "kv/transfer_block_io.hpp"
#include "platform/file_ranges.hpp"
#include "platform/system.hpp"

namespace {

namespace fs = std::filesystem;
using namespace ferry::detail::kv;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::uint64_t parse_size(const std::string& text) {
  std::size_t used = 0;
  std::uint64_t n = std::stoull(text, &used);
  const char unit = used < text.size() ? text[used] : ' ';
  if (unit == 'K' || unit == 'k') n <<= 10;
  if (unit == 'M' || unit == 'm') n <<= 20;
  if (unit == 'G' || unit == 'g') n <<= 30;
  return n;
}

struct Aligned {
  explicit Aligned(std::size_t n)
      : data(static_cast<std::byte*>(ferry::detail::aligned_malloc(4096, n))) {
    if (!data) throw std::bad_alloc();
  }
  ~Aligned() { ferry::detail::aligned_free(data); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  std::byte* data;
};

StagedTimes minus(const StagedTimes& b, const StagedTimes& a) {
  return {b.io - a.io, b.copy_wait - a.copy_wait, b.queue - a.queue, b.hash - a.hash,
          b.hash_wait - a.hash_wait};
}

struct Options {
  std::vector<std::uint64_t> sizes{1ull << 20, 4ull << 20, 16ull << 20};
  std::uint64_t bytes = 256ull << 20, batch = 16, batch_bytes = 0;
  unsigned pieces = 2, rounds = 3, threads = 0;
};

void profile(const fs::path& root, std::uint64_t block, const Options& o) {
  const std::uint64_t batch =
      o.batch_bytes ? std::max<std::uint64_t>(1, o.batch_bytes / block) : o.batch;
  const std::uint64_t count = std::max(batch, o.bytes / block);
  const std::uint64_t slot = (block + 4095) / 4096 * 4096;
  const fs::path dir = root / "kv-staged-profile";
  fs::remove_all(dir);
  fs::create_directories(dir);
  double put_s = 1e30, cold_s = 1e30, warm_s = 1e30;
  StagedTimes put_t, cold_t, warm_t;
  {
    SlabFiles slabs(dir, 1, slot * count, true);
    TransferBlockIo io(slabs, slot, true, ferry::KVPath::Staged, false, true, o.threads);
    Aligned source(block * batch), target(block * batch);
    for (std::uint64_t i = 0; i < block * batch; ++i)
      source.data[i] = static_cast<std::byte>(i * 131 + i / 4099);
    // Block b of a batch in `pieces` equal parts (the last takes the rest).
    const auto pieces_of = [&](std::byte* base, std::uint64_t b) {
      std::vector<BlockSpan> out;
      const std::uint64_t part = block / o.pieces;
      for (unsigned p = 0; p < o.pieces; ++p)
        out.push_back({base + b * block + part * p, p + 1 == o.pieces ? block - part * p : part});
      return out;
    };
    std::vector<std::uint64_t> sums(count);
    // One pass over every block; returns seconds, adds the workers' times.
    const auto pass = [&](bool writing, StagedTimes& times) {
      const StagedTimes before = io.staged_times();
      double seconds = 0;  // in the block I/O's calls only (not the checks)
      for (std::uint64_t first = 0; first < count; first += batch) {
        const std::uint64_t n = std::min(batch, count - first);
        std::vector<std::vector<BlockSpan>> spans(n);
        std::vector<BlockRequest> requests(n);
        for (std::uint64_t b = 0; b < n; ++b) {
          spans[b] = pieces_of(writing ? source.data : target.data, b);
          requests[b].offset = (first + b) * slot;
          requests[b].pieces = spans[b];
          requests[b].checksum = sums[first + b];
        }
        const auto start = Clock::now();
        if (writing) {
          io.write(requests, nullptr);
          io.sync(0);
        } else {
          io.read(requests);
        }
        seconds += seconds_since(start);
        for (std::uint64_t b = 0; b < n; ++b) {
          FERRY_EXPECT(requests[b].outcome == BlockOutcome::ok, std::runtime_error,
                       "kv_staged_profile: ", requests[b].message);
          if (writing) sums[first + b] = requests[b].checksum;
        }
        if (!writing)
          FERRY_EXPECT(std::memcmp(target.data, source.data, n * block) == 0, std::runtime_error,
                       "kv_staged_profile: the blocks got back differ from those put");
      }
      const StagedTimes t = minus(io.staged_times(), before);
      times = {times.io + t.io / o.rounds, times.copy_wait + t.copy_wait / o.rounds,
               times.queue + t.queue / o.rounds, times.hash + t.hash / o.rounds,
               times.hash_wait + t.hash_wait / o.rounds};
      return seconds;
    };
    const auto fd = slabs.buffered_fd(0);
    for (unsigned r = 0; r < o.rounds; ++r) {
      put_s = std::min(put_s, pass(true, put_t));
      ferry::detail::sync_data(fd);
      ferry::detail::drop_cached_pages(fd);
      std::memset(target.data, 0, block * batch);
      cold_s = std::min(cold_s, pass(false, cold_t));
      std::vector<std::byte> buffer(8 << 20);
      for (std::uint64_t at = 0; at < slot * count; at += buffer.size())
        ferry::detail::read_some_at(fd, buffer.data(), buffer.size(), at);
      std::memset(target.data, 0, block * batch);
      warm_s = std::min(warm_s, pass(false, warm_t));
    }
  }
  fs::remove_all(dir);
  const double gb = double(count * block) / 1e9;
  const auto line = [&](const char* what, double s, const StagedTimes& t) {
    std::printf(
        "  %-9s %6.2f GB/s  %7.1f ms/pass; workers (thread-ms/pass): I/O %.0f, copy wait "
        "%.0f, queue %.0f, hash %.0f (in I/O for puts, queue for gets), hash wait %.0f\n",
        what, gb / s, s * 1e3, t.io * 1e3, t.copy_wait * 1e3, t.queue * 1e3, t.hash * 1e3,
        t.hash_wait * 1e3);
  };
  std::printf(
      "%llu KiB blocks x %llu, %llu per call, %u pieces each, %s workers (best of %u "
      "rounds):\n",
      static_cast<unsigned long long>(block >> 10), static_cast<unsigned long long>(count),
      static_cast<unsigned long long>(batch), o.pieces,
      o.threads ? std::to_string(o.threads).c_str() : "default", o.rounds);
  line("put", put_s, put_t);
  line("get cold", cold_s, cold_t);
  line("get warm", warm_s, warm_t);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || (argc % 2) != 0) {
    std::fprintf(stderr,
                 "usage: kv_staged_profile ROOT [--sizes 1M,4M,16M] [--bytes 256M] [--batch 16 | "
                 "--batch-bytes 64M] [--pieces 2] [--rounds 3] [--threads N]\n");
    return 2;
  }
  try {
    Options o;
    for (int i = 2; i + 1 < argc; i += 2) {
      const std::string flag = argv[i], value = argv[i + 1];
      if (flag == "--sizes") {
        o.sizes.clear();
        for (std::size_t at = 0; at <= value.size();) {
          const std::size_t comma = std::min(value.find(',', at), value.size());
          o.sizes.push_back(parse_size(value.substr(at, comma - at)));
          at = comma + 1;
        }
      } else if (flag == "--bytes") {
        o.bytes = parse_size(value);
      } else if (flag == "--batch") {
        o.batch = std::max<std::uint64_t>(1, parse_size(value));
      } else if (flag == "--batch-bytes") {
        o.batch_bytes = parse_size(value);
      } else if (flag == "--pieces") {
        o.pieces = std::max(1u, static_cast<unsigned>(parse_size(value)));
      } else if (flag == "--threads") {
        o.threads = static_cast<unsigned>(parse_size(value));
      } else if (flag == "--rounds") {
        o.rounds = std::max(1u, static_cast<unsigned>(parse_size(value)));
      } else {
        std::fprintf(stderr, "kv_staged_profile: unknown option %s\n", flag.c_str());
        return 2;
      }
    }
    for (std::uint64_t block : o.sizes) profile(argv[1], block, o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kv_staged_profile: %s\n", e.what());
    return 1;
  }
  return 0;
}
