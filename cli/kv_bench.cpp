// `ferry kv bench` (kv_bench.hpp): timings for reporting only, never for tests.
#include "kv_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>

#include "cuda/cuda_resources.hpp"
#include "cuda/gpu_checksum.hpp"
#include "shim/gds_mode.hpp"
#include "ferry/error.hpp"
#include "kv/checksum.hpp"
#include "platform/file_ops.hpp"
#include "platform/file_ranges.hpp"
#include "kv_bench_memory.hpp"
#include "kv_bench_raw.hpp"

namespace ferry {
namespace {

using kv_bench::BatchMemory;
using kv_bench::drop_cache;
using kv_bench::median;
using kv_bench::piece_layout;
using kv_bench::PieceLayout;
using kv_bench::RawFile;
using kv_bench::round_up;
using kv_bench::seconds_since;
using kv_bench::slabs_of;
using kv_bench::warm;

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
constexpr unsigned kWarmPasses = 3;  // warm passes a round without page-cache DMA

// Median GB/s of copying `bytes` between pinned host memory and the device, each way.
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

// Median GB/s of the GPU checksum over `batch` blocks of `block` bytes in device memory, after
// checking its digests against the host's on the same bytes; 0 and the reason where it cannot run.
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

// The share of the files' bytes in the page cache, probed in 64 MiB windows (a window counts
// when wholly resident).
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

void accumulate(KVBenchTimes& into, const KVBenchTimes& t, double weight) {
  into.pass += t.pass * weight;
  into.move += t.move * weight;
  into.sync += t.sync * weight;
  into.journal += t.journal * weight;
  into.io += t.io * weight;
  into.copy_wait += t.copy_wait * weight;
  into.queue += t.queue * weight;
  into.setup += t.setup * weight;
  into.hash += t.hash * weight;
  into.hash_wait += t.hash_wait * weight;
  into.transfer += t.transfer * weight;
  into.span += t.span * weight;
  into.copies += t.copies * weight;
  into.lead += t.lead * weight;
  into.tail += t.tail * weight;
  into.prepare += t.prepare * weight;
}

// Rounds of puts then gets (cold, then warm) of `count` blocks in batches, each beside the raw
// I/O of the same bytes (alternating which goes first); returns the row of medians.
KVBenchRow bench_one(const KVBenchOptions& o, std::uint64_t block, KVPath path) {
  const std::uint64_t batch = kv_bench_batch(o, block);
  const std::uint64_t count = std::max(batch, o.bytes / block);
  const PieceLayout layout = piece_layout(o);
  const KVNamespace ns{"kv-bench", "bytes",
                       "block=" + std::to_string(block) +
                           ",pieces=" + std::to_string(layout.pieces) + ",layout=" + o.layout,
                       0, 1};
  KVStoreOptions options;
  options.gpu_path = path;
  options.allow_compat = true;
  options.checkpoint_on_close = false;
  options.page_cache_pin_bytes = o.page_cache_pin;
  options.gpu_groups = o.gpu_groups;
  BatchMemory source(o.device, block, batch, layout), target(o.device, block, batch, layout);
  std::vector<std::byte> pattern(block * batch);
  for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = std::byte(i * 131 + i / 4099);
  source.fill(pattern);
  // The target's pages made before round 0's cold gets, as the raw reads' buffers are: else the
  // first O_DIRECT reads fault them in (about a second per 256 MiB on a 2-core machine).
  target.fill(std::vector<std::byte>(pattern.size()));
  std::vector<std::vector<KVPiece>> in(batch), out(batch);
  for (std::uint64_t b = 0; b < batch; ++b) {
    in[b] = source.block(b);
    out[b] = target.block(b);
  }
  const std::vector<KVBlock> sources(in.begin(), in.end()), targets(out.begin(), out.end());
  KVBenchRow row;
  row.checksum = std::string(detail::kv::checksum_kernel_name(detail::kv::checksum_kernel()));
  row.block_bytes = block;
  row.blocks = count;
  row.batch = batch;
  row.warm_resident = 1;
  row.rounds = std::max(1u, o.rounds);
  const fs::path dir = o.root / KVStore::directory_name(ns);
  fs::remove_all(dir);
  std::vector<double> put_s, cold_s, warm_s, raw_write_s, raw_cold_s, raw_warm_s;
  std::vector<double> registered_s, register_s, staged_s;
  row.page_cache_dma_share = o.page_cache_pin ? 1 : 0;
  {
    // Room for one round's blocks: each round's puts evict the round before's.
    auto store = KVStore::open(o.root, ns, count * round_up(block), block, options);
    // With page-cache DMA: the same store read without it, for the warm gets it is measured
    // against (a reader follows the writer's commits).
    std::unique_ptr<KVStore> staged;
    if (o.page_cache_pin) {
      KVStoreOptions plain = options;
      plain.page_cache_pin_bytes = 0;
      plain.read_only = true;
      staged = std::make_unique<KVStore>(
          KVStore::open(o.root, ns, count * round_up(block), block, plain));
    }
    RawFile raw(o.root / "kv-bench-raw.bin", block, count, batch);
    const std::vector<fs::path> slabs = slabs_of(dir);
    std::vector<KVKey> keys(batch);
    // One pass over the round's `count` keys (through `through`: the store, or the reader
    // without page-cache DMA), its times added to `times` as `share` of the round's.
    const auto run = [&](bool put, std::uint64_t round, KVBenchTimes& times,
                         KVStore* through = nullptr, double share = 1) {
      KVStore& store_ = through ? *through : store;
      const KVStats before = store_.stats();
      const auto start = Clock::now();
      for (std::uint64_t i = 0; i < count; i += batch) {
        const std::uint64_t n = std::min(batch, count - i);
        for (std::uint64_t k = 0; k < n; ++k) keys[k] = round * count + i + k + 1;
        const auto results = put ? store_.put(std::span(keys).first(n), std::span(sources).first(n))
                                 : store_.get(std::span(keys).first(n), std::span(targets).first(n));
        for (const KVResult& r : results) {
          FERRY_EXPECT(r.ok() && r.status != KVStatus::already_present, std::runtime_error,
                       "kv bench ", put ? "put" : "get", " of ", block,
                       "-byte blocks: ", to_string(r.status), ": ", r.message);
          row.path = to_string(r.route);
        }
      }
      const double pass = seconds_since(start);
      accumulate(times, kv_bench_times_between(before, store_.stats(), pass), share / row.rounds);
      return pass;
    };
    const std::uint64_t last = count - (count - 1) / batch * batch;  // blocks in the last batch
    const auto check = [&] {
      const std::vector<std::byte> got = target.read();
      FERRY_EXPECT(std::equal(got.begin(), got.begin() + last * block, pattern.begin()),
                   std::runtime_error, "kv bench: the blocks got back differ from those put (",
                   block, "-byte blocks, ", row.path, ")");
    };
    // Each pair in turn, ferry's first in even rounds.
    const auto pair = [](std::uint64_t round, const auto& ferry, const auto& raw_io) {
      if (round % 2 == 0) {
        ferry();
        raw_io();
      } else {
        raw_io();
        ferry();
      }
    };
    for (std::uint64_t r = 0; r < row.rounds; ++r) {
      pair(
          r, [&] { put_s.push_back(run(true, r, row.put_times)); },
          [&] { raw_write_s.push_back(raw.write()); });
      pair(
          r,
          [&] {
            for (const auto& slab : slabs) drop_cache(slab);
            cold_s.push_back(run(false, r, row.cold_times));
          },
          [&] { raw_cold_s.push_back(raw.read_cold()); });
      check();
      target.fill(std::vector<std::byte>(pattern.size()));
      pair(
          r,
          [&] {
            for (const auto& slab : slabs) warm(slab);
            if (staged) {
              KVBenchTimes unused;
              staged_s.push_back(run(false, r, unused, staged.get()));
              row.warm_staged_path = row.path;
              check();
              target.fill(std::vector<std::byte>(pattern.size()));  // each pass's bytes checked
            }
            const KVStats before = store.stats();
            // Without page-cache DMA several passes a round: one pass of 1 GiB takes 30-70 ms,
            // and one pass a round moved by 10% between identical builds. With it, one: the
            // next pass would find its windows registered.
            const unsigned passes = o.page_cache_pin ? 1 : kWarmPasses;
            for (unsigned p = 0; p < passes; ++p) {
              if (p > 0) {
                check();
                target.fill(std::vector<std::byte>(pattern.size()));
              }
              warm_s.push_back(run(false, r, row.warm_times, nullptr, 1.0 / passes));
            }
            row.warm_resident = std::min(row.warm_resident, resident_share(slabs));
            if (o.page_cache_pin == 0) return;
            // The warm pass asked for its windows' registrations; they run in the background.
            while (store.stats().page_cache_windows_pending > 0)
              std::this_thread::sleep_for(std::chrono::milliseconds(1));
            const KVStats registered = store.stats();
            register_s.push_back(registered.page_cache_register_seconds -
                                 before.page_cache_register_seconds);
            check();
            target.fill(std::vector<std::byte>(pattern.size()));
            KVBenchTimes unused;
            registered_s.push_back(run(false, r, unused));
            row.warm_registered_path = row.path;
            const KVStats after = store.stats();
            const double share = 1.0 / row.rounds;
            row.registered_pass_seconds += registered_s.back() * share;
            row.page_cache_dma_seconds +=
                (after.page_cache_dma_seconds - registered.page_cache_dma_seconds) * share;
            row.page_cache_checksum_seconds +=
                (after.page_cache_checksum_seconds - registered.page_cache_checksum_seconds) *
                share;
            row.page_cache_scatter_seconds +=
                (after.page_cache_scatter_seconds - registered.page_cache_scatter_seconds) * share;
            const double dma =
                double(after.page_cache_dma_bytes - registered.page_cache_dma_bytes);
            row.page_cache_dma_share =
                std::min(row.page_cache_dma_share, dma / (double(count) * double(block)));
          },
          [&] { raw_warm_s.push_back(raw.read_warm()); });
      check();
    }
  }
  fs::remove_all(dir);
  const double gb = double(count) * double(block) / 1e9;
  row.put_gbps = gb / median(put_s);
  row.get_cold_gbps = gb / median(cold_s);
  row.get_warm_gbps = gb / median(warm_s);
  row.put_iops = double(count) / median(put_s);
  row.get_iops = double(count) / median(cold_s);
  row.raw_write_gbps = gb / median(raw_write_s);
  row.raw_read_gbps = gb / median(raw_cold_s);
  row.raw_warm_read_gbps = gb / median(raw_warm_s);
  const auto rates = [gb](const std::vector<double>& seconds) {
    std::vector<double> out;
    for (double s : seconds) out.push_back(gb / s);
    return out;
  };
  row.put_round_gbps = rates(put_s);
  row.raw_write_round_gbps = rates(raw_write_s);
  row.get_cold_round_gbps = rates(cold_s);
  row.raw_read_round_gbps = rates(raw_cold_s);
  if (o.page_cache_pin) {
    row.get_warm_registered_gbps = gb / median(registered_s);
    row.get_warm_staged_gbps = gb / median(staged_s);
    row.page_cache_register_seconds = median(register_s);
  }
  if (o.device.is_cuda()) {
    std::tie(row.pinned_d2h_gbps, row.pinned_h2d_gbps) =
        pinned_copies(o.device.index, block * batch);
    try {  // a measurement beside the store's rows: its failure is reported, not fatal
      std::tie(row.gpu_checksum_gbps, row.gpu_checksum_note) =
          gpu_checksum_rate(o.device.index, block, batch);
    } catch (const std::exception& e) {
      row.gpu_checksum_note = e.what();
    }
  }
  return row;
}

}  // namespace

KVBenchTimes kv_bench_times_between(const KVStats& a, const KVStats& b, double pass) {
  KVBenchTimes t;
  t.pass = pass;
  t.move = (b.put_move_seconds - a.put_move_seconds) + (b.get_move_seconds - a.get_move_seconds);
  t.sync = b.put_sync_seconds - a.put_sync_seconds;
  t.journal = b.put_journal_seconds - a.put_journal_seconds;
  t.io = b.staged_io_seconds - a.staged_io_seconds;
  t.copy_wait = b.staged_copy_wait_seconds - a.staged_copy_wait_seconds;
  t.queue = b.staged_queue_seconds - a.staged_queue_seconds;
  t.setup = b.staged_setup_seconds - a.staged_setup_seconds;
  t.hash = b.staged_hash_seconds - a.staged_hash_seconds;
  t.hash_wait = b.staged_hash_wait_seconds - a.staged_hash_wait_seconds;
  t.transfer = b.staged_transfer_seconds - a.staged_transfer_seconds;
  t.span = b.staged_thread_span_seconds - a.staged_thread_span_seconds;
  t.copies = double(b.staged_copies - a.staged_copies);
  t.lead = b.staged_lead_seconds - a.staged_lead_seconds;
  t.tail = b.staged_tail_seconds - a.staged_tail_seconds;
  t.prepare = b.get_prepare_seconds - a.get_prepare_seconds;
  return t;
}

std::uint64_t kv_bench_batch(const KVBenchOptions& o, std::uint64_t block) {
  return o.batch_bytes ? std::max<std::uint64_t>(1, o.batch_bytes / block) : o.batch;
}

std::uint64_t kv_layout_block_bytes(const KVBenchOptions& o) {
  const PieceLayout l = piece_layout(o);
  return l.name.empty() ? 0 : l.page * l.pieces;
}

std::vector<KVBenchRow> run_kv_bench(const KVBenchOptions& o,
                                     const std::function<void(const KVBenchRow&)>& on_row) {
  FERRY_EXPECT(o.batch >= 1 && o.pieces >= 1, std::invalid_argument,
               "kv bench: batch and pieces must be at least 1");
  std::vector<KVPath> paths = o.paths;
  if (!o.device.is_cuda()) {
    paths = {KVPath::Auto};  // host memory: the host path whatever is asked
  } else if (paths.empty()) {
    paths.push_back(KVPath::Staged);
    if (detail::driver_verdict(detail::probe_cufile()).mode != detail::CuFileMode::Unavailable)
      paths.push_back(KVPath::Direct);
  }
  fs::create_directories(o.root);
  std::vector<KVBenchRow> rows;
  const std::vector<std::uint64_t> sizes =
      o.layout.empty() ? o.block_sizes : std::vector<std::uint64_t>{kv_layout_block_bytes(o)};
  for (std::uint64_t block : sizes) {
    FERRY_EXPECT(block >= o.pieces, std::invalid_argument, "kv bench: ", block,
                 "-byte blocks cannot hold ", o.pieces, " pieces");
    for (KVPath path : paths) {
      rows.push_back(bench_one(o, block, path));
      if (on_row) on_row(rows.back());
    }
  }
  return rows;
}

}  // namespace ferry
