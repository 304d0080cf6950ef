// kv_bench_memory.hpp: a batch of blocks in an engine's layout, and page-cache helpers.
#include "kv_bench_memory.hpp"

#include <algorithm>
#include <cstring>

#include "cuda/cuda_resources.hpp"
#include "ferry/error.hpp"
#include "platform/file_ops.hpp"
#include "platform/file_ranges.hpp"

namespace ferry::kv_bench {

namespace fs = std::filesystem;

std::pair<std::uint64_t, std::uint64_t> PieceLayout::piece(std::uint64_t block,
                                                        std::uint64_t batch, std::uint64_t b,
                                                        unsigned p) const {
  if (name.empty()) {
    const std::uint64_t part = block / pieces;
    return {b * block + part * p, p + 1 == pieces ? block - part * p : part};
  }
  const unsigned layer = p / per_layer, kv = p % per_layer;
  if (name == "vllm")  // [2, batch, page] per layer: K pages, then V pages
    return {layer * 2 * batch * page + (kv * batch + b) * page, page};
  // vllm-canonical, mla: [batch, page] per layer; sglang: a K and a V tensor [batch, page]
  return {(layer * per_layer + kv) * batch * page + b * page, page};
}

PieceLayout piece_layout(const KVBenchOptions& o) {
  PieceLayout l;
  l.name = o.layout;
  l.pieces = o.pieces;
  if (o.layout.empty()) return l;
  const std::uint64_t tokens_bytes = std::uint64_t(o.block_tokens) * o.element_bytes;
  l.layers = o.layers;
  if (o.layout == "vllm" || o.layout == "sglang") {
    l.per_layer = 2;
    l.page = tokens_bytes * o.kv_heads * o.head_dim;
  } else if (o.layout == "vllm-canonical") {
    l.per_layer = 1;
    l.page = 2 * tokens_bytes * o.kv_heads * o.head_dim;
  } else if (o.layout == "mla") {
    l.per_layer = 1;
    l.page = tokens_bytes * 576;  // the latent (512) and rope (64) values of each token
  } else {
    detail::fail<std::invalid_argument>("kv bench: unknown layout \"", o.layout,
                                        "\" (vllm, vllm-canonical, mla or sglang)");
  }
  FERRY_EXPECT(o.layers >= 1 && l.page >= 1, std::invalid_argument,
               "kv bench: a layout needs layers, block tokens, heads, head size and element "
               "bytes of at least 1");
  l.pieces = o.layers * l.per_layer;
  return l;
}

BatchMemory::BatchMemory(const Device& device, std::uint64_t block, std::uint64_t batch,
                         PieceLayout layout)
    : _device(device), _block(block), _batch(batch), _layout(std::move(layout)) {
  const std::uint64_t bytes = block * batch;
  if (device.is_cuda()) {
    _context = std::make_shared<detail::PrimaryContext>(device.index);
    _memory = detail::allocate_device_memory(_context, bytes);
  } else {
    _memory = detail::allocate_host_memory(bytes);
  }
}

std::vector<KVPiece> BatchMemory::block(std::uint64_t b) const {
  std::vector<KVPiece> out;
  for (unsigned p = 0; p < _layout.pieces; ++p) {
    const auto [offset, size] = _layout.piece(_block, _batch, b, p);
    out.push_back({base() + offset, size, _device});
  }
  return out;
}

void BatchMemory::fill(const std::vector<std::byte>& bytes) const {
  if (!_device.is_cuda()) return void(std::memcpy(base(), bytes.data(), bytes.size()));
  _context->make_current();
  FERRY_CU(cuMemcpyHtoDAsync, reinterpret_cast<shim::cu::DevicePtr>(base()), bytes.data(),
           bytes.size(), nullptr);
  FERRY_CU(cuStreamSynchronize, nullptr);
}

std::vector<std::byte> BatchMemory::read() const {
  std::vector<std::byte> out(_block * _batch);
  if (!_device.is_cuda()) {
    std::memcpy(out.data(), base(), out.size());
    return out;
  }
  _context->make_current();
  FERRY_CU(cuMemcpyDtoH, out.data(), reinterpret_cast<shim::cu::DevicePtr>(base()), out.size());
  return out;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;  // even: the middle two's mean
}

// Drops the file's pages from the page cache (clean ones: the slabs are written O_DIRECT or
// synced), so the next read comes from the device.
void drop_cache(const fs::path& file) {
  const detail::FileDescriptor fd = detail::open_existing(file, false);
  if (!fd) return;
  detail::sync_data(fd.get());
  detail::drop_cached_pages(fd.get());
}

// Reads a file through the page cache.
void warm(const fs::path& file) {
  std::vector<char> buffer(8 << 20);
  const detail::FileDescriptor fd = detail::open_existing(file, false);
  if (!fd) return;
  for (std::uint64_t at = 0;;) {
    const std::int64_t n = detail::read_some_at(fd.get(), buffer.data(), buffer.size(), at);
    if (n <= 0) break;
    at += static_cast<std::uint64_t>(n);
  }
}

// The slab files of a store's directory.
std::vector<fs::path> slabs_of(const fs::path& directory) {
  std::vector<fs::path> out;
  for (const auto& entry : fs::directory_iterator(directory))
    if (entry.path().filename().string().rfind("slab-", 0) == 0) out.push_back(entry.path());
  return out;
}

}  // namespace ferry::kv_bench
