// `ferry kv bench` (ferry/kv_bench.hpp): timings for reporting only, never for tests.
#include "ferry/kv_bench.hpp"


#include <algorithm>
#include <chrono>
#include <cstring>

#include "cuda/cuda_resources.hpp"
#include "cufile/gds_mode.hpp"
#include "ferry/error.hpp"
#include "platform/file_ops.hpp"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
constexpr std::uint64_t kAlign = 4096;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::uint64_t round_up(std::uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// One batch of blocks in memory on the bench's device: `batch` blocks of `pieces` pieces.
class BatchMemory {
 public:
  BatchMemory(const Device& device, std::uint64_t block, std::uint64_t batch, unsigned pieces)
      : _device(device), _block(block), _batch(batch), _pieces(pieces) {
    const std::uint64_t bytes = block * batch;
    if (device.is_cuda()) {
      _context = std::make_shared<detail::PrimaryContext>(device.index);
      _memory = detail::allocate_device_memory(_context, bytes);
    } else {
      _memory = detail::allocate_host_memory(bytes);
    }
  }
  std::byte* base() const { return static_cast<std::byte*>(_memory.get()); }
  // Block b's pieces: equal parts, the last one taking the remainder.
  std::vector<KVPiece> block(std::uint64_t b) const {
    std::vector<KVPiece> out;
    const std::uint64_t part = _block / _pieces;
    for (unsigned p = 0; p < _pieces; ++p) {
      const std::uint64_t size = p + 1 == _pieces ? _block - part * p : part;
      out.push_back({base() + b * _block + part * p, size, _device});
    }
    return out;
  }
  void fill(const std::vector<std::byte>& bytes) const {
    if (!_device.is_cuda()) return void(std::memcpy(base(), bytes.data(), bytes.size()));
    _context->make_current();
    FERRY_CU(cuMemcpyHtoDAsync, reinterpret_cast<shim::cu::DevicePtr>(base()), bytes.data(),
             bytes.size(), nullptr);
    FERRY_CU(cuStreamSynchronize, nullptr);
  }
  std::vector<std::byte> read() const {
    std::vector<std::byte> out(_block * _batch);
    if (!_device.is_cuda()) {
      std::memcpy(out.data(), base(), out.size());
      return out;
    }
    _context->make_current();
    FERRY_CU(cuMemcpyDtoH, out.data(), reinterpret_cast<shim::cu::DevicePtr>(base()), out.size());
    return out;
  }

 private:
  Device _device;
  std::uint64_t _block, _batch;
  unsigned _pieces;
  std::shared_ptr<detail::PrimaryContext> _context;
  std::shared_ptr<void> _memory;
};

// Median GB/s of copying `bytes` between pinned host memory and the device, each way.
std::pair<double, double> pinned_copies(int ordinal, std::uint64_t bytes) {
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

// Raw O_DIRECT of the same bytes: one pwrite per block, fdatasync per batch, then one pread per
// block (cold: written with O_DIRECT, never cached).
std::pair<double, double> raw_direct(const fs::path& file, std::uint64_t block, std::uint64_t count,
                                     std::uint64_t batch) {
  const std::uint64_t slot = round_up(block);
  auto buffer = detail::allocate_host_memory(slot);
  std::memset(buffer.get(), 0x5A, slot);
  detail::FileDescriptor created = detail::open_or_create(file, 0600);
  if (!created) FERRY_SYSCALL_FAIL(file.string(), ": cannot open");
  if (const int error = detail::preallocate(created.get(), slot * count); error != 0)
    detail::fail_errno(error, file.string(), ": fallocate");
  detail::FileDescriptor direct = detail::open_existing(file, true, true);
  const detail::NativeDescriptor fd = direct ? direct.get() : created.get();
  auto start = Clock::now();
  for (std::uint64_t i = 0; i < count; ++i) {
    if (detail::write_some_at(fd, buffer.get(), slot, i * slot) != static_cast<std::int64_t>(slot))
      FERRY_SYSCALL_FAIL(file.string(), ": pwrite");
    if (((i + 1) % batch == 0 || i + 1 == count) && !detail::sync_data(fd))
      FERRY_SYSCALL_FAIL(file.string(), ": fdatasync");
  }
  const double write_s = seconds_since(start);
  start = Clock::now();
  for (std::uint64_t i = 0; i < count; ++i)
    if (detail::read_some_at(fd, buffer.get(), slot, i * slot) != static_cast<std::int64_t>(slot))
      FERRY_SYSCALL_FAIL(file.string(), ": pread");
  const double read_s = seconds_since(start);
  direct = {};
  created = {};  // closed before the removal (Windows removes an open file only at its close)
  fs::remove(file);
  const double gb = double(count) * double(block) / 1e9;
  return {gb / write_s, gb / read_s};
}

// Reads every slab of the store's directory through the page cache.
void warm_slabs(const fs::path& directory) {
  std::vector<char> buffer(8 << 20);
  for (const auto& entry : fs::directory_iterator(directory)) {
    if (entry.path().filename().string().rfind("slab-", 0) != 0) continue;
    const detail::FileDescriptor fd = detail::open_existing(entry.path(), false);
    if (!fd) continue;
    for (std::uint64_t at = 0;;) {
      const std::int64_t n = detail::read_some_at(fd.get(), buffer.data(), buffer.size(), at);
      if (n <= 0) break;
      at += static_cast<std::uint64_t>(n);
    }
  }
}

// Puts then gets (cold, then warm) `count` blocks in batches; returns the row.
KVBenchRow bench_one(const KVBenchOptions& o, std::uint64_t block, KVPath path) {
  const std::uint64_t count = std::max(o.batch, o.bytes / block);
  const KVNamespace ns{"kv-bench", "bytes",
                       "block=" + std::to_string(block) + ",pieces=" + std::to_string(o.pieces), 0,
                       1};
  KVStoreOptions options;
  options.gpu_path = path;
  options.allow_compat = true;
  options.checkpoint_on_close = false;
  BatchMemory source(o.device, block, o.batch, o.pieces),
      target(o.device, block, o.batch, o.pieces);
  std::vector<std::byte> pattern(block * o.batch);
  for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = std::byte(i * 131 + i / 4099);
  source.fill(pattern);
  std::vector<std::vector<KVPiece>> in(o.batch), out(o.batch);
  for (std::uint64_t b = 0; b < o.batch; ++b) {
    in[b] = source.block(b);
    out[b] = target.block(b);
  }
  const std::vector<KVBlock> sources(in.begin(), in.end()), targets(out.begin(), out.end());
  KVBenchRow row;
  row.block_bytes = block;
  row.blocks = count;
  const fs::path dir = o.root / KVStore::directory_name(ns);
  fs::remove_all(dir);
  {
    auto store = KVStore::open(o.root, ns, count * round_up(block), block, options);
    std::vector<KVKey> keys(o.batch);
    const auto run = [&](bool put) {
      const auto start = Clock::now();
      for (std::uint64_t i = 0; i < count; i += o.batch) {
        const std::uint64_t n = std::min(o.batch, count - i);
        for (std::uint64_t k = 0; k < n; ++k) keys[k] = i + k + 1;
        const auto results = put ? store.put(std::span(keys).first(n), std::span(sources).first(n))
                                 : store.get(std::span(keys).first(n), std::span(targets).first(n));
        for (const KVResult& r : results) {
          FERRY_EXPECT(r.ok(), std::runtime_error, "kv bench ", put ? "put" : "get", " of ", block,
                       "-byte blocks: ", to_string(r.status), ": ", r.message);
          row.path = to_string(r.route);
        }
      }
      return seconds_since(start);
    };
    const double gb = double(count) * double(block) / 1e9;
    const double put_s = run(true);
    const double cold_s = run(false);
    const std::uint64_t last = count - (count - 1) / o.batch * o.batch;  // blocks in the last batch
    const std::vector<std::byte> got = target.read();
    FERRY_EXPECT(std::equal(got.begin(), got.begin() + last * block, pattern.begin()),
                 std::runtime_error, "kv bench: the blocks got back differ from those put (", block,
                 "-byte blocks, ", row.path, ")");
    warm_slabs(dir);
    const double warm_s = run(false);
    row.put_gbps = gb / put_s;
    row.get_cold_gbps = gb / cold_s;
    row.get_warm_gbps = gb / warm_s;
    row.put_iops = double(count) / put_s;
    row.get_iops = double(count) / cold_s;
  }
  fs::remove_all(dir);
  std::tie(row.raw_write_gbps, row.raw_read_gbps) =
      raw_direct(o.root / "kv-bench-raw.bin", block, count, o.batch);
  if (o.device.is_cuda())
    std::tie(row.pinned_d2h_gbps, row.pinned_h2d_gbps) =
        pinned_copies(o.device.index, block * o.batch);
  return row;
}

}  // namespace

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
  for (std::uint64_t block : o.block_sizes) {
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
